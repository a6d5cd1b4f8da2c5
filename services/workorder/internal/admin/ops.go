// Package admin is the work-order service's operator surface. Its inbox
// entries, outbox, parked messages, dead letters (of the completions and of
// the InvoiceIssued consumer) and the operator_audit log are the one
// operator API, lossless.ops.v1.OperatorService (pkg/operator over
// OperatorDeps): mounted by the app, and run in process by the command
// line (`workorder inbox|outbox|parked|dead-letters|audit ...`,
// operator.RunCLI). What no pattern package owns, the manual re-hand-off,
// is its own: the gRPC service lossless.workorder.v1.WorkOrderAdminService
// (Service) and `workorder orders re-hand-off` (RunOrdersCLI). Every
// repair needs a ticket and an actor and is audited in operator_audit, dry
// runs included.
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// Ops are the work-order service's own repairs, shared by the CLI and
// gRPC.
type Ops struct {
	db     pgdb.DB
	logger *slog.Logger
}

// NewOps returns the repairs over the work-order database.
func NewOps(db pgdb.DB, logger *slog.Logger) (*Ops, error) {
	if db == nil || logger == nil {
		return nil, errors.New("admin: NewOps needs a database and a logger")
	}
	return &Ops{db: db, logger: logger}, nil
}

// ErrInvalidRequest is returned for a request that is incomplete or out of
// bounds; nothing was changed.
var ErrInvalidRequest = errors.New("admin: invalid request")

// ErrOrderNotHandedOff refuses a re-hand-off of an order that is not waiting.
var ErrOrderNotHandedOff = errors.New("admin: work order is not " + string(orders.StatusHandedOff))

// RecordReHandOff records one more open waiting point for a HANDED_OFF
// order, as a manual re-hand-off does (orders.Order.ReHandOff: the repair
// builds the next failure), with a history entry and the audit row in the
// same transaction. With two open waiting points the next completion parks
// as AMBIGUOUS (F7); that is the point: it is visible, not guessed.
func (o *Ops) RecordReHandOff(ctx context.Context, ticket, actor string, orderID uuid.UUID) (wpID int64, open int, err error) {
	if err := operator.ValidateAuthorization(ticket, actor); err != nil {
		return 0, 0, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	err = pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
		var illegal *orders.IllegalTransitionError
		wo, err := orders.InTx(tx).Update(ctx, orderID, func(wo *orders.Order) error {
			return wo.ReHandOff("operator:re-hand-off:" + ticket)
		})
		switch {
		case errors.Is(err, orders.ErrNotFound):
			return fmt.Errorf("%w: unknown work order %s", ErrInvalidRequest, orderID)
		case errors.As(err, &illegal):
			return fmt.Errorf("%w (status %s)", ErrOrderNotHandedOff, illegal.From)
		case err != nil:
			return err
		}
		// The new waiting point has the highest id: it is the last open one.
		points := wo.OpenWaitingPoints()
		wpID, open = points[len(points)-1], len(points)
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "workorder.re-hand-off", Actor: actor, StatedActor: actor, Ticket: ticket,
			Params: map[string]any{"work_order_id": orderID.String(), "waiting_point_id": wpID, "open_waiting_points": open}, Affected: 1})
	})
	return wpID, open, err
}
