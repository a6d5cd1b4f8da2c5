package orders

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The API's and the operators' reads beyond one order: pages of orders and
// an order's history. Off the order's path (docs/tour.md), next to the
// writes in repository.go.

const (
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
	// One caller's orders, on the (created_by, created_at, id) index,
	// restricted to the customers the caller acts for ($5; NULL: every
	// one). The restriction is in SQL, not applied to the page afterwards,
	// so a page is full whenever more rows follow (a client whose
	// AUTH_CLIENTS entry lost a customer no longer sees that customer's
	// orders, even those it created).
	qListByCreator = `
SELECT ` + orderColumns + ` FROM work_orders
WHERE created_by = $4 AND (created_at, id) < ($1, $2)
  AND ($5::text[] IS NULL OR customer_id = ANY($5))
ORDER BY created_at DESC, id DESC
LIMIT $3`
	// One caller's orders in one status: the same index range, filtered (a
	// caller's orders are few next to the table; an index per filter
	// combination would cost every insert).
	qListByCreatorStatus = `
SELECT ` + orderColumns + ` FROM work_orders
WHERE created_by = $5 AND status = $4 AND (created_at, id) < ($1, $2)
  AND ($6::text[] IS NULL OR customer_id = ANY($6))
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
	// CreatedBy, when not empty, lists only the orders of that creator.
	CreatedBy string
	// Customers, when not nil, lists only the orders of those customers
	// (the caller's, authz.Customers.IDs). Only with CreatedBy: the
	// operators who list every creator's orders act for every customer.
	Customers []string
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
	if q.Customers != nil && q.CreatedBy == "" {
		return nil, nil, fmt.Errorf("orders: list by customers needs a creator")
	}
	// One row more than asked tells whether a next page exists.
	var rows pgx.Rows
	var err error
	switch {
	case q.CreatedBy != "" && q.Status == "":
		rows, err = r.db.Query(ctx, qListByCreator, after, afterID, q.Limit+1, q.CreatedBy, q.Customers)
	case q.CreatedBy != "":
		rows, err = r.db.Query(ctx, qListByCreatorStatus, after, afterID, q.Limit+1, string(q.Status), q.CreatedBy, q.Customers)
	case q.Status == "":
		rows, err = r.db.Query(ctx, qList, after, afterID, q.Limit+1)
	default:
		rows, err = r.db.Query(ctx, qListByStatus, after, afterID, q.Limit+1, string(q.Status))
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
	rows, err := r.db.Query(ctx, qHistory, id)
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
	if err := r.db.QueryRow(ctx, qExists, id).Scan(&exists); err != nil {
		return nil, fmt.Errorf("orders: history of %s: %w", id, err)
	}
	if !exists {
		return nil, ErrNotFound
	}
	return list, nil
}
