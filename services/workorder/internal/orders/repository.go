package orders

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// Repository reads work orders from PostgreSQL and updates one in a
// transaction of its own (Update). Writes happen in one local transaction
// with everything that must commit with them: the order's row, its
// transitions, its waiting points and its outbox events. No remote call is
// ever made while one of its transactions is open. Make one with
// NewRepository; inside a transaction begun elsewhere, use InTx.
type Repository struct {
	db pgdb.DB
}

// NewRepository returns a Repository on db, normally the pool.
func NewRepository(db pgdb.DB) (*Repository, error) {
	if db == nil {
		return nil, errors.New("orders: db is nil")
	}
	return &Repository{db: db}, nil
}

// TxRepository writes work orders in one transaction begun elsewhere (a use
// case's, a relay's or a consumer's) and uses nothing else. Get one from
// InTx; the zero TxRepository has no transaction and refuses every call.
type TxRepository struct {
	tx pgx.Tx
}

// InTx returns the repository of transaction tx: what it writes commits or
// rolls back with tx.
func InTx(tx pgx.Tx) TxRepository { return TxRepository{tx: tx} }

// errNoTx: a method called on the zero TxRepository.
var errNoTx = errors.New("orders: TxRepository has no transaction (use orders.InTx)")

// errRowCount: a write did not touch the rows decided on under the row
// locks, which only a writer bypassing the locks can cause. A technical
// error: the caller's transaction rolls back and is retried.
var errRowCount = errors.New("orders: row count differs from the decision")

const orderColumns = `id, customer_id, description, positions, currency_code, unit_price_minor, status,
       completed_items, coalesce(provider_job_id, ''), coalesce(invoice_id::text, ''), version, created_at, updated_at, created_by`

const (
	// The transaction's timestamp: now() is fixed for a transaction, and
	// the order's created_at and updated_at default to it, so a create that
	// reads it first builds its hand-off event (and its response) before
	// the insert, which then travels with the event's.
	qNow = `SELECT now()`

	// The order and its first transition (whose foreign key is checked at the statement's end).
	qInsertOrder = `
WITH o AS (INSERT INTO work_orders (id, customer_id, description, positions, currency_code, unit_price_minor, status, created_by)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id, status, version, created_at, updated_at),
t AS (INSERT INTO work_order_transitions (work_order_id, from_status, to_status, cause) SELECT o.id, NULL, o.status, $9 FROM o)
SELECT version, created_at, updated_at FROM o`

	qGet = `SELECT ` + orderColumns + ` FROM work_orders WHERE id = $1`

	// The hand-off's pre-check reads of concurrent dispatches, in one
	// statement (package handoff, prechecks).
	qStatuses = `SELECT id, status FROM work_orders WHERE id = ANY($1::uuid[])`

	// Locks the orders in id order, so that two transactions locking
	// overlapping sets cannot deadlock. Every writer of an order locks its
	// row first (this package is the only writer), so once this returns
	// nobody else can change what the following statements read. Those run
	// as separate statements on purpose: under READ COMMITTED each takes a
	// new snapshot, taken AFTER these locks were granted; folded into this
	// statement they would share its snapshot, taken before a lock wait, and
	// miss a waiting point inserted by the transaction that held the lock.
	// Row values returned here are the latest committed (a locked row is
	// re-read after the wait).
	qLock = `SELECT ` + orderColumns + ` FROM work_orders WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE`
	// Open waiting points of the locked orders, locked too: belt and braces
	// against a writer that would touch them without the order lock. They
	// are consumed in the same transaction, so "the waiting point vanished
	// between query and delivery" has no window. The lock order is the
	// partial index's own, waiting_points_open_idx (work_order_id, id): with
	// ORDER BY id alone, the generic plan a pooled connection caches while the
	// table is small walks the primary key in id order and filters, which
	// became a scan of the whole table per call as it grew (B5 measured 1.2 ms
	// a call, the server's costliest statement).
	qLockOpenWaitingPoints = `
SELECT work_order_id, id FROM waiting_points
WHERE work_order_id = ANY($1::uuid[]) AND consumed_at IS NULL
ORDER BY work_order_id, id
FOR UPDATE`

	// Set-based, one statement per table for any number of orders. The
	// version in the WHERE is the one read under the lock: it always matches,
	// and the row count check turns a violation into an error. w.id = ANY($1)
	// repeats the join for the planner: a cached generic plan prices unnest
	// of a parameter at 100 rows and, against a table of up to tens of
	// thousands of orders, preferred a hash join over a sequential scan of
	// the whole table to 100 primary-key lookups (B5 found it); the ANY lets
	// it find the rows by primary key.
	qUpdate = `
UPDATE work_orders w
SET status = u.status, completed_items = u.completed_items, provider_job_id = NULLIF(u.job, ''),
    invoice_id = NULLIF(u.invoice, '')::uuid, version = w.version + 1, updated_at = now()
FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[], $5::text[], $6::bigint[])
     AS u(id, status, completed_items, job, invoice, version)
WHERE w.id = ANY($1::uuid[]) AND w.id = u.id AND w.version = u.version
RETURNING w.id, w.version, w.updated_at`

	qInsertWaitingPoints = `
INSERT INTO waiting_points (work_order_id, provider_job_id, cause)
SELECT u.id, NULLIF(u.job, ''), u.cause FROM unnest($1::uuid[], $2::text[], $3::text[]) AS u(id, job, cause)
RETURNING work_order_id, id`

	// consumed_at IS NULL plus the row count check: a waiting point already
	// consumed would mean the locks failed.
	qConsumeWaitingPoints = `
UPDATE waiting_points w
SET consumed_at = now(), consumed_by = u.cause
FROM unnest($1::bigint[], $2::text[]) AS u(id, cause)
WHERE w.id = u.id AND w.consumed_at IS NULL`

	// unnest keeps the array order, so history ids follow the order in
	// which the transitions were recorded.
	qInsertTransitions = `
INSERT INTO work_order_transitions (work_order_id, from_status, to_status, cause)
SELECT u.id, NULLIF(u.from_status, ''), u.to_status, u.cause
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS u(id, from_status, to_status, cause)`
)

// Create writes a new order (from New), its first transition and its
// WorkOrderHandOffRequested outbox event in r's transaction, so the order
// exists if and only if its hand-off event does (I1). It returns the order
// as stored.
func (r TxRepository) Create(ctx context.Context, o Order) (Order, error) {
	if r.tx == nil {
		return Order{}, errNoTx
	}
	var at time.Time
	if err := r.tx.QueryRow(ctx, qNow).Scan(&at); err != nil {
		return Order{}, fmt.Errorf("orders: create %s: %w", o.ID, err)
	}
	return r.create(ctx, o, at)
}

// create is Create once the transaction's timestamp at (qNow) is known:
// the order and its event go in one round trip.
func (r TxRepository) create(ctx context.Context, o Order, at time.Time) (Order, error) {
	if o.Status != StatusCreated || len(o.transitions) != 1 {
		return Order{}, errors.New("orders: Create needs an order fresh from New")
	}
	o.Version, o.CreatedAt, o.UpdatedAt = 1, at, at // the columns' defaults
	ev, err := handOffEvent(ctx, o)
	if err != nil {
		return Order{}, err
	}
	b := &pgx.Batch{}
	b.Queue(qInsertOrder, o.ID, o.CustomerID, o.Description, o.Positions,
		o.UnitPrice.CurrencyCode, o.UnitPrice.MinorUnits, string(o.Status), o.CreatedBy,
		o.transitions[0].Cause).QueryRow(func(row pgx.Row) error {
		var v int64
		var created, updated time.Time
		if err := row.Scan(&v, &created, &updated); err != nil || (v == 1 && created.Equal(at) && updated.Equal(at)) {
			return err
		}
		// The event and the response were built from the defaults.
		return fmt.Errorf("stored version %d, created %v, updated %v; want 1 at the transaction's %v", v, created, updated, at)
	})
	if err := (outbox.Writer{}).AppendWith(ctx, r.tx, b, ev); err != nil {
		return Order{}, fmt.Errorf("orders: create %s: %w", o.ID, err)
	}
	o.rowChanged, o.transitions = false, nil // inserted as they are
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
// methods (Cancel, AcceptHandOff...) and saves the changes, all in one
// transaction of its own. fn's error aborts the transaction and is returned
// as is. Unknown id: ErrNotFound. In a transaction begun elsewhere, use
// InTx(tx).Update.
func (r *Repository) Update(ctx context.Context, id uuid.UUID, fn func(*Order) error) (Order, error) {
	var o Order
	err := pgdb.InTx(ctx, r.db, nil, func(tx *pgdb.Tx) error {
		var err error
		o, err = InTx(tx).Update(ctx, id, fn)
		return err
	})
	if err != nil {
		return Order{}, err
	}
	return o, nil
}

// Update is Repository.Update in r's transaction: Lock, fn, Save.
func (r TxRepository) Update(ctx context.Context, id uuid.UUID, fn func(*Order) error) (Order, error) {
	o, err := r.Lock(ctx, id)
	if err != nil {
		return Order{}, err
	}
	if err := fn(&o); err != nil {
		return Order{}, err
	}
	if err := r.Save(ctx, &o); err != nil {
		return Order{}, err
	}
	return o, nil
}

// Lock reads the order under a row lock held until r's transaction ends,
// with its open waiting points, in one round trip. Unknown id: ErrNotFound.
func (r TxRepository) Lock(ctx context.Context, id uuid.UUID) (Order, error) {
	if r.tx == nil {
		return Order{}, errNoTx
	}
	found := make(map[uuid.UUID]*Order, 1)
	b := &pgx.Batch{}
	QueueLock(b, []uuid.UUID{id}, found)
	if err := r.tx.SendBatch(ctx, b).Close(); err != nil {
		return Order{}, fmt.Errorf("orders: lock %s: %w", id, err)
	}
	o := found[id]
	if o == nil {
		return Order{}, ErrNotFound
	}
	return *o, nil
}

// QueueLock queues onto b, for the caller to send in its transaction with
// statements of its own, the locking reads of TxRepository.Lock for the
// orders ids. Reading b's results puts each order found into found.
func QueueLock(b *pgx.Batch, ids []uuid.UUID, found map[uuid.UUID]*Order) {
	b.Queue(qLock, ids).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			o, err := scanOrder(rows)
			if err != nil {
				return err
			}
			found[o.ID] = &o
		}
		return rows.Err()
	})
	b.Queue(qLockOpenWaitingPoints, ids).Query(func(rows pgx.Rows) error {
		var (
			orderID uuid.UUID
			wp      int64
		)
		_, err := pgx.ForEachRow(rows, []any{&orderID, &wp}, func() error {
			if o := found[orderID]; o != nil {
				o.open = append(o.open, wp)
			}
			return nil
		})
		return err
	})
}

// Save writes the changes recorded on os (locked by Lock or QueueLock in
// r's transaction) in it, in one round trip; see QueueSave.
func (r TxRepository) Save(ctx context.Context, os ...*Order) error {
	if r.tx == nil {
		return errNoTx
	}
	b := &pgx.Batch{}
	QueueSave(b, os...)
	if b.Len() == 0 {
		return nil
	}
	if err := r.tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("orders: save: %w", err)
	}
	return nil
}

// QueueSave queues onto b, for the caller to send in the transaction that
// locked os, the writes of the changes recorded on them: one statement per
// table (rows, new waiting points, consumed waiting points, history)
// however many orders, each checking it touched the rows decided on. The
// changes are taken off os now; reading b's results sets their versions and
// open waiting points. If b fails, the transaction must roll back and os be
// discarded.
func QueueSave(b *pgx.Batch, os ...*Order) {
	var (
		rowIDs                       []uuid.UUID
		statuses, jobs, invoices     []string
		completed                    []int32
		versions                     []int64
		wpOrders                     []uuid.UUID
		wpJobs, wpCauses             []string
		consumeIDs                   []int64
		consumeCauses                []string
		histOrders                   []uuid.UUID
		histFrom, histTo, histCauses []string
	)
	byID := make(map[uuid.UUID]*Order, len(os))
	for _, o := range os {
		if !o.changed() {
			continue
		}
		byID[o.ID] = o
		if o.rowChanged {
			rowIDs = append(rowIDs, o.ID)
			statuses = append(statuses, string(o.Status))
			completed = append(completed, o.CompletedItems)
			jobs = append(jobs, o.ProviderJobID)
			invoices = append(invoices, o.InvoiceID)
			versions = append(versions, o.Version)
		}
		for _, w := range o.waitingPoints {
			wpOrders, wpJobs, wpCauses = append(wpOrders, o.ID), append(wpJobs, w.ProviderJobID), append(wpCauses, w.Cause)
		}
		for _, c := range o.consumed {
			consumeIDs, consumeCauses = append(consumeIDs, c.waitingPoint), append(consumeCauses, c.cause)
			o.open = slices.DeleteFunc(o.open, func(id int64) bool { return id == c.waitingPoint })
		}
		for _, t := range o.transitions {
			histOrders, histFrom = append(histOrders, o.ID), append(histFrom, string(t.From))
			histTo, histCauses = append(histTo, string(t.To)), append(histCauses, t.Cause)
		}
		o.rowChanged, o.transitions, o.waitingPoints, o.consumed = false, nil, nil, nil
	}
	if len(rowIDs) > 0 {
		b.Queue(qUpdate, rowIDs, statuses, completed, jobs, invoices, versions).Query(func(rows pgx.Rows) error {
			var (
				id      uuid.UUID
				version int64
				at      time.Time
			)
			n, err := pgx.ForEachRow(rows, []any{&id, &version, &at}, func() error {
				byID[id].Version, byID[id].UpdatedAt = version, at
				return nil
			})
			return rowsExpected(err, "update orders", n.RowsAffected(), len(rowIDs))
		})
	}
	if len(wpOrders) > 0 {
		b.Queue(qInsertWaitingPoints, wpOrders, wpJobs, wpCauses).Query(func(rows pgx.Rows) error {
			var (
				id uuid.UUID
				wp int64
			)
			n, err := pgx.ForEachRow(rows, []any{&id, &wp}, func() error {
				byID[id].open = append(byID[id].open, wp)
				return nil
			})
			return rowsExpected(err, "record waiting points", n.RowsAffected(), len(wpOrders))
		})
	}
	if len(consumeIDs) > 0 {
		b.Queue(qConsumeWaitingPoints, consumeIDs, consumeCauses).Exec(func(tag pgconn.CommandTag) error {
			return rowsExpected(nil, "consume waiting points", tag.RowsAffected(), len(consumeIDs))
		})
	}
	if len(histOrders) > 0 {
		b.Queue(qInsertTransitions, histOrders, histFrom, histTo, histCauses).Exec(func(tag pgconn.CommandTag) error {
			return rowsExpected(nil, "record transitions", tag.RowsAffected(), len(histOrders))
		})
	}
}

func rowsExpected(err error, what string, got int64, want int) error {
	switch {
	case err != nil:
		return fmt.Errorf("orders: %s: %w", what, err)
	case got != int64(want):
		return fmt.Errorf("orders: %s: %w: %d rows, want %d", what, errRowCount, got, want)
	}
	return nil
}

// Get returns one order. Unknown id: ErrNotFound.
func (r *Repository) Get(ctx context.Context, id uuid.UUID) (Order, error) {
	return scanOrder(r.db.QueryRow(ctx, qGet, id))
}

// Statuses returns the status of each of ids that names an order; an
// unknown id has no entry.
func (r *Repository) Statuses(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]Status, error) {
	rows, err := r.db.Query(ctx, qStatuses, ids)
	if err != nil {
		return nil, fmt.Errorf("orders: read statuses: %w", err)
	}
	out := make(map[uuid.UUID]Status, len(ids))
	var (
		id     uuid.UUID
		status string
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error {
		out[id] = Status(status)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("orders: read statuses: %w", err)
	}
	return out, nil
}

func scanOrder(row pgx.Row) (Order, error) {
	var o Order
	var status string
	err := row.Scan(&o.ID, &o.CustomerID, &o.Description, &o.Positions, &o.UnitPrice.CurrencyCode, &o.UnitPrice.MinorUnits,
		&status, &o.CompletedItems, &o.ProviderJobID, &o.InvoiceID, &o.Version, &o.CreatedAt, &o.UpdatedAt, &o.CreatedBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, ErrNotFound
	}
	if err != nil {
		return Order{}, fmt.Errorf("orders: read order: %w", err)
	}
	o.Status = Status(status)
	return o, nil
}
