package admin

import (
	"errors"
	"log/slog"

	gpubsub "cloud.google.com/go/pubsub/v2"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
)

// ConsumerInvoicing names the InvoiceIssued consumer (subscription
// workorder.billing-events) in OperatorService requests and audit actions
// (invoicing.replay-parked, invoicing.replay-dead-letters).
const ConsumerInvoicing = "invoicing"

// OperatorDeps are the work-order database's stores for the one operator
// API (pkg/operator), as the app mounts OperatorService (adding the token)
// and the CLI runs it in process (operator.NewInProcess, operator.RunCLI):
// the outbox, the operator_audit log, and the InvoiceIssued consumer's
// parked messages and dead letters, replayed through inv (configure it as
// the live consumer). ps is needed only to replay dead letters.
func OperatorDeps(db pgdb.DB, inv *invoicing.Invoicing, ps *gpubsub.Client, logger *slog.Logger) (operator.Deps, error) {
	if inv == nil {
		return operator.Deps{}, errors.New("admin: OperatorDeps needs the InvoiceIssued consumer")
	}
	store, err := parked.New()
	if err != nil {
		return operator.Deps{}, err
	}
	return operator.Deps{DB: db, TokenEnv: EnvOperatorToken, Parked: store, PubSub: ps, Logger: logger, Consumers: []operator.Consumer{
		operator.ConsumerOf(ConsumerInvoicing, topology.SubBillingEventsDeadLetter, inv),
	}}, nil
}
