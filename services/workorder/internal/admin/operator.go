package admin

import (
	"context"
	"errors"
	"log/slog"
	"slices"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/workorder/internal/correlation"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// The consumers' names in OperatorService requests (field consumer, CLI
// --consumer) and audit actions (<name>.replay-parked,
// <name>.replay-dead-letters).
const (
	// ConsumerInvoicing is the InvoiceIssued consumer (subscription
	// workorder.billing-events): parked messages and dead letters. The
	// command line's default.
	ConsumerInvoicing = "invoicing"
	// ConsumerInbox is the completions' receiver (subscription
	// workorder.completed): dead letters, re-entered into the inbox.
	ConsumerInbox = "inbox"
)

// OperatorDeps are the work-order database's stores for the one operator
// API (pkg/operator), as the app mounts OperatorService (adding the token)
// and the CLI runs it in process (operator.NewInProcess, operator.RunCLI):
// the outbox, the operator_audit log, the inbox entries, the completions'
// dead letters (decoded as recv configures the live receiver), and the
// InvoiceIssued consumer's parked messages and dead letters, replayed
// through inv (configure it as the live consumer). ps is needed only to
// replay dead letters.
func OperatorDeps(db pgdb.DB, inv *invoicing.Invoicing, recv receiver.Config, ps *gpubsub.Client, logger *slog.Logger) (operator.Deps, error) {
	if inv == nil {
		return operator.Deps{}, errors.New("admin: OperatorDeps needs the InvoiceIssued consumer")
	}
	store, err := parked.New()
	if err != nil {
		return operator.Deps{}, err
	}
	entries, err := operator.NewInboxOps(db)
	if err != nil {
		return operator.Deps{}, err
	}
	completions, err := inboxConsumer(db, recv)
	if err != nil {
		return operator.Deps{}, err
	}
	return operator.Deps{DB: db, TokenEnv: EnvOperatorToken, Parked: store, Inbox: entries, InboxSource: correlation.Source,
		PubSub: ps, Logger: logger, Consumers: []operator.Consumer{
			operator.ConsumerOf(ConsumerInvoicing, topology.SubBillingEventsDeadLetter, inv),
			completions,
		}}, nil
}

// inboxConsumer re-enters the completions' dead letters through the
// receiver's own path (receiver.Decoder + inbox.Store.Ingest: the same
// unique key, so a message already in the inbox is a no-op). As in the
// receiver, a message that cannot be stored as received is parked (poison)
// and its batch-mates re-enter; the batch is one transaction, so an
// infrastructure error fails (and releases) all of it. Ingest counts its
// outcomes per batch, so the outcomes are its tallies (inserted,
// duplicate, poison, conflict), not matched to message ids.
func inboxConsumer(db pgdb.DB, recv receiver.Config) (operator.Consumer, error) {
	store, err := inbox.NewStore(db, nil)
	if err != nil {
		return operator.Consumer{}, err
	}
	dec, err := receiver.NewDecoder(recv)
	if err != nil {
		return operator.Consumer{}, err
	}
	return operator.Consumer{Name: ConsumerInbox, DeadLetterSubscription: topology.SubWorkOrderCompletedDeadLetter,
		Process: func(ctx context.Context, ms []*pubsub.Received) ([]string, []error) {
			msgs := make([]inbox.Message, len(ms))
			for i, m := range ms {
				msgs[i] = dec.Decode(m)
			}
			res, err := store.Ingest(ctx, msgs)
			outcomes := slices.Concat(slices.Repeat([]string{"inserted"}, res.Inserted),
				slices.Repeat([]string{"duplicate"}, res.Duplicates), slices.Repeat([]string{"poison"}, res.Poison),
				slices.Repeat([]string{"conflict"}, res.Conflicts))
			outcomes = append(outcomes, slices.Repeat([]string{"ingested"}, max(len(ms)-len(outcomes), 0))...)[:len(ms)]
			return outcomes, slices.Repeat([]error{err}, len(ms)) // one transaction: all or none
		}}, nil
}
