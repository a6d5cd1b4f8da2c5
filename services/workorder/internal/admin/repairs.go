package admin

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/operator"
)

// The InvoiceIssued consumer's repairs (subscription
// workorder.billing-events): list and replay parked messages; replaying its
// dead letters is ReplayInvoicingDeadLetters (ops.go). The CLI
// (RunInvoicingCLI) calls them; over the network the same repairs are
// OperatorService's (pkg/operator, consumer invoicing, mounted by the app).

// ParkedReplayRequest names one parked InvoiceIssued to replay.
type ParkedReplayRequest struct {
	inbox.Authorization
	// ID of the parked_messages row (required).
	ID int64
	// DryRun applies and rolls back: it reports the outcome the message
	// would have, or why it is still refused, and changes nothing but the
	// audit row.
	DryRun bool
}

// ReplayParkedBillingEvent applies an open parked InvoiceIssued through the
// consumer (Invoicing.Replay: COMPLETED → INVOICED or a duplicate, the row
// marked replayed by the actor under the ticket) and audits it in
// operator_audit (action invoicing.replay-parked) in the same transaction.
// A message still refused changes nothing and is not audited; its error
// wraps invoicing.ErrStillRefused.
func (o *Ops) ReplayParkedBillingEvent(ctx context.Context, req ParkedReplayRequest) (outcome string, err error) {
	if err := req.Validate(); err != nil {
		return "", fmt.Errorf("%w: %w", inbox.ErrInvalidRequest, err)
	}
	if req.ID <= 0 {
		return "", fmt.Errorf("%w: a parked message id is required", inbox.ErrInvalidRequest)
	}
	err = pgx.BeginFunc(ctx, o.deps.Pool, func(tx pgx.Tx) error {
		err := operator.InSavepoint(ctx, tx, req.DryRun, func(sp pgx.Tx) (err error) {
			outcome, err = o.invoicing.Replay(ctx, sp, req.ID, req.Ticket, req.Actor)
			return err
		})
		if err != nil {
			return err
		}
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "invoicing.replay-parked", Actor: req.Actor, Ticket: req.Ticket,
			DryRun: req.DryRun, Params: map[string]any{"parked_id": req.ID, "outcome": outcome}, Affected: 1})
	})
	if err != nil {
		return "", err
	}
	return outcome, nil
}
