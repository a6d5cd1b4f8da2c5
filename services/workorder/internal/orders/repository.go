package orders

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// Repository stores work orders in PostgreSQL. Writes happen in one local
// transaction with everything that must commit with them: the order's
// transitions, its waiting points and its outbox events. No remote call is
// ever made while one of its transactions is open.
type Repository struct {
	pool *pgxpool.Pool
}

// NewRepository returns a Repository on pool.
func NewRepository(pool *pgxpool.Pool) (*Repository, error) {
	if pool == nil {
		return nil, errors.New("orders: pool is nil")
	}
	return &Repository{pool: pool}, nil
}

const orderColumns = `id, customer_id, description, positions, currency_code, unit_price_minor, status,
       completed_items, coalesce(provider_job_id, ''), coalesce(invoice_id::text, ''), version, created_at, updated_at`

const (
	qInsertOrder = `
INSERT INTO work_orders (id, customer_id, description, positions, currency_code, unit_price_minor, status)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING version, created_at, updated_at`

	qInsertTransition = `
INSERT INTO work_order_transitions (work_order_id, from_status, to_status, cause)
VALUES ($1, NULLIF($2, ''), $3, $4)
RETURNING occurred_at`

	qInsertWaitingPoint = `
INSERT INTO waiting_points (work_order_id, provider_job_id, cause)
VALUES ($1, $2, $3)`

	qGet = `SELECT ` + orderColumns + ` FROM work_orders WHERE id = $1`

	// FOR UPDATE serialises every read-modify-write of one order: a cancel
	// and a hand-off acceptance can never both see CREATED.
	qGetForUpdate = qGet + ` FOR UPDATE`

	qUpdate = `
UPDATE work_orders
SET status = $2, completed_items = $3, provider_job_id = NULLIF($4, ''), invoice_id = NULLIF($5, '')::uuid,
    version = version + 1, updated_at = now()
WHERE id = $1
RETURNING version, updated_at`

	// Keyset pagination, newest first: the row comparison matches the index
	// (created_at DESC, id DESC) exactly, so every page is one index range
	// scan however deep the client pages (OFFSET would rescan all skipped
	// rows). The first page passes created_at = +infinity. created_at is the
	// creating transaction's start time, so an order whose transaction
	// commits late may appear behind a page already read; a new listing
	// shows it.
	qList = `
SELECT ` + orderColumns + ` FROM work_orders
WHERE (created_at, id) < ($1, $2)
ORDER BY created_at DESC, id DESC
LIMIT $3`
	// Same, on the (status, created_at, id) index.
	qListByStatus = `
SELECT ` + orderColumns + ` FROM work_orders
WHERE status = $4 AND (created_at, id) < ($1, $2)
ORDER BY created_at DESC, id DESC
LIMIT $3`

	// Transitions of one order are written under its row lock, so identity
	// order is the order in which they happened.
	qHistory = `
SELECT coalesce(from_status, ''), to_status, cause, occurred_at
FROM work_order_transitions
WHERE work_order_id = $1
ORDER BY id`

	qExists = `SELECT EXISTS (SELECT 1 FROM work_orders WHERE id = $1)`
)

// Create writes a new order (from New), its first transition and its
// WorkOrderHandOffRequested outbox event in tx, the caller's transaction, so
// the order exists if and only if its hand-off event does (I1). It returns
// the order as stored.
func (r *Repository) Create(ctx context.Context, tx pgx.Tx, o Order) (Order, error) {
	if o.Status != StatusCreated || len(o.transitions) != 1 {
		return Order{}, errors.New("orders: Create needs an order fresh from New")
	}
	if err := tx.QueryRow(ctx, qInsertOrder, o.ID, o.CustomerID, o.Description, o.Positions,
		o.UnitPrice.CurrencyCode, o.UnitPrice.MinorUnits, string(o.Status)).Scan(&o.Version, &o.CreatedAt, &o.UpdatedAt); err != nil {
		return Order{}, fmt.Errorf("orders: insert %s: %w", o.ID, err)
	}
	ev, err := handOffEvent(ctx, o)
	if err != nil {
		return Order{}, err
	}
	if err := outbox.Append(ctx, tx, ev); err != nil {
		return Order{}, fmt.Errorf("orders: append hand-off event of %s: %w", o.ID, err)
	}
	if err := r.saveChanges(ctx, tx, &o); err != nil {
		return Order{}, err
	}
	return o, nil
}

// handOffEvent builds the order's hand-off event. The event id is in the
// payload too: consumers see one stable id across re-dispatches.
func handOffEvent(ctx context.Context, o Order) (outbox.Event, error) {
	eventID, err := uuid.NewV7()
	if err != nil {
		return outbox.Event{}, fmt.Errorf("orders: new event id: %w", err)
	}
	msg := &eventsv1.WorkOrderHandOffRequested{
		EventId:     eventID.String(),
		WorkOrderId: o.ID.String(),
		CustomerId:  o.CustomerID,
		Description: o.Description,
		Positions:   o.Positions,
		UnitPrice:   &moneyv1.Money{CurrencyCode: o.UnitPrice.CurrencyCode, MinorUnits: o.UnitPrice.MinorUnits},
		OccurredAt:  timestamppb.New(o.CreatedAt),
	}
	ev, err := outbox.NewEvent(ctx, AggregateType, o.ID.String(), msg)
	if err != nil {
		return outbox.Event{}, fmt.Errorf("orders: hand-off event of %s: %w", o.ID, err)
	}
	ev.ID = eventID
	ev.OccurredAt = o.CreatedAt
	return ev, nil
}

// Update loads the order under a row lock, lets fn change it through its
// methods (Cancel, AcceptHandOff...) and saves the changes with their
// transitions and waiting points, all in one transaction. fn's error aborts
// the transaction and is returned as is. Unknown id: ErrNotFound.
func (r *Repository) Update(ctx context.Context, id uuid.UUID, fn func(*Order) error) (Order, error) {
	var o Order
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var err error
		o, err = r.UpdateTx(ctx, tx, id, fn)
		return err
	})
	if err != nil {
		return Order{}, err
	}
	return o, nil
}

// UpdateTx is Update in the caller's transaction (the outbox relay's mark
// transaction, for the hand-off).
func (r *Repository) UpdateTx(ctx context.Context, tx pgx.Tx, id uuid.UUID, fn func(*Order) error) (Order, error) {
	o, err := scanOrder(tx.QueryRow(ctx, qGetForUpdate, id))
	if err != nil {
		return Order{}, err
	}
	if err := fn(&o); err != nil {
		return Order{}, err
	}
	if !o.changed() {
		return o, nil
	}
	if err := tx.QueryRow(ctx, qUpdate, o.ID, string(o.Status), o.CompletedItems, o.ProviderJobID, o.InvoiceID).
		Scan(&o.Version, &o.UpdatedAt); err != nil {
		return Order{}, fmt.Errorf("orders: update %s: %w", o.ID, err)
	}
	if err := r.saveChanges(ctx, tx, &o); err != nil {
		return Order{}, err
	}
	return o, nil
}

// saveChanges writes the transitions and waiting points recorded on o.
func (r *Repository) saveChanges(ctx context.Context, tx pgx.Tx, o *Order) error {
	for _, t := range o.transitions {
		if err := tx.QueryRow(ctx, qInsertTransition, o.ID, string(t.From), string(t.To), t.Cause).Scan(new(time.Time)); err != nil {
			return fmt.Errorf("orders: record transition of %s: %w", o.ID, err)
		}
	}
	for _, w := range o.waitingPoints {
		if _, err := tx.Exec(ctx, qInsertWaitingPoint, o.ID, w.ProviderJobID, w.Cause); err != nil {
			return fmt.Errorf("orders: record waiting point of %s: %w", o.ID, err)
		}
	}
	o.transitions, o.waitingPoints = nil, nil
	return nil
}

// Get returns one order. Unknown id: ErrNotFound.
func (r *Repository) Get(ctx context.Context, id uuid.UUID) (Order, error) {
	return scanOrder(r.pool.QueryRow(ctx, qGet, id))
}

// Cursor is the position after the last order of a page.
type Cursor struct {
	CreatedAt time.Time
	ID        uuid.UUID
}

// ListQuery selects a page of orders, newest first.
type ListQuery struct {
	// Status filters by status; empty means all.
	Status Status
	// After is the previous page's last position; nil means the first page.
	After *Cursor
	// Limit is the page size (at least 1).
	Limit int
}

// List returns up to q.Limit orders and, when more may follow, the cursor of
// the next page.
func (r *Repository) List(ctx context.Context, q ListQuery) ([]Order, *Cursor, error) {
	if q.Limit < 1 {
		return nil, nil, fmt.Errorf("orders: list limit %d < 1", q.Limit)
	}
	after := pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	afterID := uuid.Max
	if q.After != nil {
		after = pgtype.Timestamptz{Time: q.After.CreatedAt, Valid: true}
		afterID = q.After.ID
	}
	// One row more than asked tells whether a next page exists.
	var rows pgx.Rows
	var err error
	if q.Status == "" {
		rows, err = r.pool.Query(ctx, qList, after, afterID, q.Limit+1)
	} else {
		rows, err = r.pool.Query(ctx, qListByStatus, after, afterID, q.Limit+1, string(q.Status))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("orders: list: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Order, error) { return scanOrder(row) })
	if err != nil {
		return nil, nil, fmt.Errorf("orders: list: %w", err)
	}
	if len(list) <= q.Limit {
		return list, nil, nil
	}
	list = list[:q.Limit]
	last := list[len(list)-1]
	return list, &Cursor{CreatedAt: last.CreatedAt, ID: last.ID}, nil
}

// History returns every transition of an order, oldest first. Unknown id:
// ErrNotFound.
func (r *Repository) History(ctx context.Context, id uuid.UUID) ([]Transition, error) {
	rows, err := r.pool.Query(ctx, qHistory, id)
	if err != nil {
		return nil, fmt.Errorf("orders: history of %s: %w", id, err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Transition, error) {
		var t Transition
		var from, to string
		err := row.Scan(&from, &to, &t.Cause, &t.At)
		t.From, t.To = Status(from), Status(to)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("orders: history of %s: %w", id, err)
	}
	if len(list) > 0 {
		return list, nil
	}
	// Every order has its creation transition, so none means no order.
	var exists bool
	if err := r.pool.QueryRow(ctx, qExists, id).Scan(&exists); err != nil {
		return nil, fmt.Errorf("orders: history of %s: %w", id, err)
	}
	if !exists {
		return nil, ErrNotFound
	}
	return list, nil
}

func scanOrder(row pgx.Row) (Order, error) {
	var o Order
	var status string
	err := row.Scan(&o.ID, &o.CustomerID, &o.Description, &o.Positions, &o.UnitPrice.CurrencyCode, &o.UnitPrice.MinorUnits,
		&status, &o.CompletedItems, &o.ProviderJobID, &o.InvoiceID, &o.Version, &o.CreatedAt, &o.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, ErrNotFound
	}
	if err != nil {
		return Order{}, fmt.Errorf("orders: read order: %w", err)
	}
	o.Status = Status(status)
	return o, nil
}
