// Package admin is the work-order service's privileged operator surface for
// the inbox (I6): list, show, replay parked entries, replay dead letters,
// cleanup, and the manual re-hand-off. The inbox operations are reachable as
// CLI commands (RunCLI, `workorder inbox ...`) and as the gRPC service
// lossless.workorder.v1.WorkOrderAdminService (Service), which requires the
// operator token. The outbox, the InvoiceIssued consumer's parked messages
// and dead letters and the operator_audit log are the one operator API,
// lossless.ops.v1.OperatorService (pkg/operator over OperatorDeps, consumer
// invoicing): mounted by the app, and run in process by the CLI
// (`workorder outbox|parked|dead-letters|audit ...`, operator.RunCLI).
// Every mutating operation needs a ticket and an actor and is audited
// (operator_audit, dry runs included).
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// Deps are what the operator operations need.
type Deps struct {
	// Pool on the work-order database (required).
	Pool *pgxpool.Pool
	// PubSub client, needed only to replay dead letters (nil: refused).
	PubSub *gpubsub.Client
	// DeadLetterSubscription to replay inbox dead letters from. Default
	// topology.SubWorkOrderCompletedDeadLetter.
	DeadLetterSubscription string
	// Receiver configures how replayed dead letters are decoded; pass the
	// receiver's own configuration (zero: the receiver's defaults).
	Receiver receiver.Config
	// Logger (required).
	Logger *slog.Logger
}

// Ops implements the operator operations shared by the CLI and gRPC.
type Ops struct {
	deps  Deps
	inbox *inbox.Ops
	store *inbox.Store
	dec   *receiver.Decoder
	// inboxDL replays the completions' dead letters; nil without a Pub/Sub
	// client.
	inboxDL *operator.DeadLetterReplayer
}

// NewOps validates deps.
func NewOps(deps Deps) (*Ops, error) {
	if deps.Pool == nil || deps.Logger == nil {
		return nil, errors.New("admin: Deps need a Pool and a Logger")
	}
	if deps.DeadLetterSubscription == "" {
		deps.DeadLetterSubscription = topology.SubWorkOrderCompletedDeadLetter
	}
	// The inbox's operator actions land in operator_audit next to the
	// service's own, not in inbox_audit.
	io, err := inbox.NewOps(deps.Pool, inbox.WithAudit(func(ctx context.Context, tx pgx.Tx, rec inbox.AuditRecord) error {
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: rec.Action, Actor: rec.Actor, Ticket: rec.Ticket,
			DryRun: rec.DryRun, Params: rec.Params, Affected: rec.Affected})
	}))
	if err != nil {
		return nil, err
	}
	store, err := inbox.NewStore(deps.Pool, nil)
	if err != nil {
		return nil, err
	}
	dec, err := receiver.NewDecoder(deps.Receiver)
	if err != nil {
		return nil, err
	}
	o := &Ops{deps: deps, inbox: io, store: store, dec: dec}
	if deps.PubSub != nil {
		if o.inboxDL, err = operator.NewDeadLetterReplayer(deps.PubSub, deps.DeadLetterSubscription, deps.Logger); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// Inbox returns the generic inbox operations (list, get, replay, cleanup).
func (o *Ops) Inbox() *inbox.Ops { return o.inbox }

// DeadLetterRequest selects dead letters to replay.
type DeadLetterRequest struct {
	inbox.Authorization
	// MessageIDs restricts the replay to these message ids; others pulled
	// are released untouched (nacked) for a later look.
	MessageIDs []string
	// MaxMessages bounds the pull (1..operator.MaxDeadLetters, required:
	// no "replay everything").
	MaxMessages int
	// DryRun pulls, reports and releases; nothing is inserted or acked.
	DryRun bool
}

// DeadLetterResult reports a dead-letter replay.
type DeadLetterResult struct {
	MessageIDs []string
	inbox.IngestResult
	DryRun bool
}

// ReplayDeadLetters pulls up to MaxMessages from the dead-letter inspection
// subscription and re-enters the selected ones through the receiver's own
// path (receiver.Decoder + inbox.Store.Ingest: the same unique key, so a
// message already in the inbox is a no-op), acks them only after that
// commit, then audits the run. As in the receiver, a message that cannot be
// stored as received is parked (poison) and its batch-mates re-enter; only
// an infrastructure error fails the replay (everything is released). The
// insert is the receiver's, unchanged, so the audit row is a separate
// transaction right after it.
func (o *Ops) ReplayDeadLetters(ctx context.Context, req DeadLetterRequest) (DeadLetterResult, error) {
	if err := req.Validate(); err != nil {
		return DeadLetterResult{}, fmt.Errorf("%w: %w", inbox.ErrInvalidRequest, err)
	}
	if o.inboxDL == nil {
		return DeadLetterResult{}, errors.New("admin: no Pub/Sub client configured")
	}
	var ingested inbox.IngestResult
	dl, err := o.inboxDL.Replay(ctx, operator.DeadLetterRequest{MaxMessages: req.MaxMessages, MessageIDs: req.MessageIDs, DryRun: req.DryRun},
		func(ctx context.Context, ms []*pubsub.Received) []error {
			msgs := make([]inbox.Message, len(ms))
			for i, m := range ms {
				msgs[i] = o.dec.Decode(m)
			}
			var err error
			ingested, err = o.store.Ingest(ctx, msgs)
			return slices.Repeat([]error{err}, len(ms)) // one transaction: all or none
		})
	switch {
	case errors.Is(err, operator.ErrInvalidRequest):
		return DeadLetterResult{}, fmt.Errorf("%w: %w", inbox.ErrInvalidRequest, err)
	case err != nil:
		return DeadLetterResult{}, fmt.Errorf("admin: re-enter dead letters: %w", err)
	}
	res := DeadLetterResult{MessageIDs: dl.MessageIDs, IngestResult: ingested, DryRun: dl.DryRun}
	err = pgx.BeginFunc(ctx, o.deps.Pool, func(tx pgx.Tx) error {
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "inbox.replay-dead-letters", Actor: req.Actor, Ticket: req.Ticket,
			DryRun: req.DryRun, Affected: len(res.MessageIDs), Params: map[string]any{
				"subscription": o.deps.DeadLetterSubscription, "message_ids": res.MessageIDs, "max_messages": req.MaxMessages,
				"inserted": res.Inserted, "duplicates": res.Duplicates, "poison": res.Poison, "conflicts": res.Conflicts,
			}})
	})
	return res, err
}

// ErrOrderNotHandedOff refuses a re-hand-off of an order that is not waiting.
var ErrOrderNotHandedOff = errors.New("admin: work order is not " + string(orders.StatusHandedOff))

// RecordReHandOff records one more open waiting point for a HANDED_OFF
// order, as a manual re-hand-off does (orders.Order.ReHandOff: the repair
// builds the next failure), with a history entry and the audit row in the
// same transaction. With two open waiting points the next completion parks
// as AMBIGUOUS (F7); that is the point: it is visible, not guessed.
func (o *Ops) RecordReHandOff(ctx context.Context, auth inbox.Authorization, orderID uuid.UUID) (wpID int64, open int, err error) {
	if err := auth.Validate(); err != nil {
		return 0, 0, fmt.Errorf("%w: %w", inbox.ErrInvalidRequest, err)
	}
	err = pgx.BeginFunc(ctx, o.deps.Pool, func(tx pgx.Tx) error {
		var illegal *orders.IllegalTransitionError
		wo, err := orders.InTx(tx).Update(ctx, orderID, func(wo *orders.Order) error {
			return wo.ReHandOff("operator:re-hand-off:" + auth.Ticket)
		})
		switch {
		case errors.Is(err, orders.ErrNotFound):
			return fmt.Errorf("%w: unknown work order %s", inbox.ErrInvalidRequest, orderID)
		case errors.As(err, &illegal):
			return fmt.Errorf("%w (status %s)", ErrOrderNotHandedOff, illegal.From)
		case err != nil:
			return err
		}
		// The new waiting point has the highest id: it is the last open one.
		points := wo.OpenWaitingPoints()
		wpID, open = points[len(points)-1], len(points)
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "workorder.re-hand-off", Actor: auth.Actor, Ticket: auth.Ticket,
			Params: map[string]any{"work_order_id": orderID.String(), "waiting_point_id": wpID, "open_waiting_points": open}, Affected: 1})
	})
	return wpID, open, err
}
