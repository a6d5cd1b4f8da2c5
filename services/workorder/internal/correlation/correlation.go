// Package correlation applies the provider's events, stored in the inbox, to
// work orders: the inbox.Handler of the work-order service. Each call runs in
// the relay's transaction, so the order's change, its history row, its
// outbox event and the inbox entry's status commit together or not at all.
package correlation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// AggregateType of the outbox events this package appends.
const AggregateType = "work_order"

const (
	// Locks the order first: every correlation of one order queues here, so
	// everything read after it is stable until commit.
	lockOrder = `
SELECT status, positions, completed_items, customer_id, description, currency_code, unit_price_minor
FROM work_orders WHERE id = $1
FOR UPDATE`
	// The applied-events relation outlives inbox cleanup: it answers "was
	// THIS event applied?" (F6) for the order's whole life.
	recordApplied = `
INSERT INTO work_order_applied_events (source, event_id, work_order_id, event_type, completed_items, inbox_id)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (source, event_id) DO NOTHING`
	// Open waiting points, locked: under the order lock nobody else can
	// consume them, and locking them also holds off a concurrent re-hand-off
	// writer that locks the order first. Partial index waiting_points_open_idx.
	lockOpenWaitingPoints = `
SELECT id FROM waiting_points
WHERE work_order_id = $1 AND consumed_at IS NULL
ORDER BY id
FOR UPDATE`
	addCompletedItems = `
UPDATE work_orders SET completed_items = completed_items + $2, version = version + 1, updated_at = now()
WHERE id = $1`
	completeOrder = `
UPDATE work_orders SET status = 'COMPLETED', version = version + 1, updated_at = now()
WHERE id = $1 AND status = 'HANDED_OFF'`
	consumeWaitingPoint = `
UPDATE waiting_points SET consumed_at = now(), consumed_by = $2
WHERE id = $1 AND consumed_at IS NULL`
	insertTransition = `
INSERT INTO work_order_transitions (work_order_id, from_status, to_status, cause)
VALUES ($1, $2, $3, $4)`
)

// Handler is the work-order correlation.
type Handler struct {
	now func() time.Time
}

// NewHandler returns the correlation handler.
func NewHandler() *Handler { return &Handler{now: time.Now} }

var _ inbox.Handler = (*Handler)(nil)

type order struct {
	status                       string
	positions, completed         int
	customerID, description, ccy string
	unitPriceMinor               int64
}

// Handle applies one inbox entry. Errors are the classified rejections of
// errors.go; anything else (database errors) is technical.
func (h *Handler) Handle(ctx context.Context, tx pgx.Tx, e *inbox.Entry) error {
	ev, err := Parse(e.EventType, e.SchemaVersion, e.Payload)
	if err != nil {
		return inbox.Park(inbox.ReasonPoison, err)
	}
	var o order
	err = tx.QueryRow(ctx, lockOrder, ev.OrderID).Scan(&o.status, &o.positions, &o.completed,
		&o.customerID, &o.description, &o.ccy, &o.unitPriceMinor)
	if errors.Is(err, pgx.ErrNoRows) {
		return &UnknownOrderError{OrderID: ev.OrderID.String()}
	}
	if err != nil {
		return fmt.Errorf("lock work order %s: %w", ev.OrderID, err)
	}
	// Insert-first duplicate check under the order lock: the primary key
	// arbitrates, no check-then-act window. Rolled back with the savepoint if
	// the entry is then rejected.
	tag, err := tx.Exec(ctx, recordApplied, e.Source, ev.EventID, ev.OrderID, ev.Type, ev.CompletedItems, e.ID)
	if err != nil {
		return fmt.Errorf("record applied event: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return &AlreadyAppliedError{OrderID: ev.OrderID.String(), EventID: ev.EventID}
	}
	switch ev.Type {
	case TypeExecutionStarted:
		return h.executionStarted(ctx, tx, ev, o)
	default:
		return h.completed(ctx, tx, e, ev, o)
	}
}

// waitingPoint returns the single open waiting point of a HANDED_OFF order.
func waitingPoint(ctx context.Context, tx pgx.Tx, ev Event, o order) (int64, error) {
	rows, err := tx.Query(ctx, lockOpenWaitingPoints, ev.OrderID)
	if err != nil {
		return 0, fmt.Errorf("lock waiting points: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("lock waiting points: %w", err)
	}
	switch len(ids) {
	case 0:
		return 0, &NotWaitingError{OrderID: ev.OrderID.String(), Status: o.status + " without an open waiting point"}
	case 1:
		return ids[0], nil
	default:
		return 0, &AmbiguousError{OrderID: ev.OrderID.String(), WaitingPoints: ids}
	}
}

// executionStarted records the provider's start in the order's history; the
// status stays as it is.
func (h *Handler) executionStarted(ctx context.Context, tx pgx.Tx, ev Event, o order) error {
	switch o.status {
	case "CREATED":
		return &NotWaitingError{OrderID: ev.OrderID.String(), Status: o.status}
	case "CANCELLED":
		return &OrderCancelledError{OrderID: ev.OrderID.String()}
	case "HANDED_OFF":
		if _, err := waitingPoint(ctx, tx, ev, o); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, insertTransition, ev.OrderID, o.status, o.status, "inbox:"+ev.EventID+":execution-started")
	return err
}

// completed applies one completion tranche (F14: an order may complete in
// several); the tranche that reaches the positions completes the order.
func (h *Handler) completed(ctx context.Context, tx pgx.Tx, e *inbox.Entry, ev Event, o order) error {
	id := ev.OrderID.String()
	switch o.status {
	case "CREATED":
		return &NotWaitingError{OrderID: id, Status: o.status}
	case "CANCELLED":
		return &OrderCancelledError{OrderID: id}
	case "COMPLETED", "INVOICED":
		// Not a duplicate (that was checked by event id): a new tranche for
		// a finished order.
		return &OverCompletionError{OrderID: id, Positions: o.positions, Completed: o.completed, Increment: ev.CompletedItems}
	}
	wp, err := waitingPoint(ctx, tx, ev, o)
	if err != nil {
		return err
	}
	total := o.completed + ev.CompletedItems
	if total > o.positions {
		return &OverCompletionError{OrderID: id, Positions: o.positions, Completed: o.completed, Increment: ev.CompletedItems}
	}
	if _, err := tx.Exec(ctx, addCompletedItems, ev.OrderID, ev.CompletedItems); err != nil {
		return fmt.Errorf("add completed items: %w", err)
	}
	cause := "inbox:" + ev.EventID
	if total < o.positions {
		_, err := tx.Exec(ctx, insertTransition, ev.OrderID, o.status, o.status,
			fmt.Sprintf("%s:tranche %d/%d", cause, total, o.positions))
		return err
	}
	tag, err := tx.Exec(ctx, consumeWaitingPoint, wp, cause)
	if err != nil {
		return fmt.Errorf("consume waiting point: %w", err)
	}
	if tag.RowsAffected() != 1 {
		// Impossible under the locks taken above; a technical error if it
		// ever happens, so the entry retries rather than parks.
		return fmt.Errorf("waiting point %d of work order %s was consumed concurrently", wp, id)
	}
	if _, err := tx.Exec(ctx, completeOrder, ev.OrderID); err != nil {
		return fmt.Errorf("complete work order: %w", err)
	}
	if _, err := tx.Exec(ctx, insertTransition, ev.OrderID, "HANDED_OFF", "COMPLETED", cause); err != nil {
		return fmt.Errorf("record transition: %w", err)
	}
	return h.appendCompletionRecorded(ctx, tx, e, ev, o, total)
}

func (h *Handler) appendCompletionRecorded(ctx context.Context, tx pgx.Tx, e *inbox.Entry, ev Event, o order, total int) error {
	eventID, err := uuid.NewV7()
	if err != nil {
		return err
	}
	now := h.now().UTC()
	msg := &eventsv1.WorkOrderCompletionRecorded{
		EventId:        eventID.String(),
		WorkOrderId:    ev.OrderID.String(),
		CustomerId:     o.customerID,
		Description:    o.description,
		Positions:      int32(o.positions),
		CompletedItems: int32(total),
		UnitPrice:      &moneyv1.Money{CurrencyCode: o.ccy, MinorUnits: o.unitPriceMinor},
		CompletedAt:    timestamppb.New(now),
	}
	out, err := outbox.NewEvent(ctx, AggregateType, ev.OrderID.String(), msg)
	if err != nil {
		return err
	}
	out.ID, out.OccurredAt = eventID, now
	// Continue the provider's trace: the inbox row kept its traceparent.
	if e.Traceparent != "" {
		out.Headers[outbox.HeaderTraceparent] = e.Traceparent
		if e.Tracestate != "" {
			out.Headers[outbox.HeaderTracestate] = e.Tracestate
		}
	}
	out.Headers[outbox.HeaderCorrelationID] = "inbox:" + ev.EventID
	return outbox.Append(ctx, tx, out)
}
