// Package store reads and writes billing's invoices. Writes take the
// caller's transaction: an invoice is inserted by the invoice job's fenced
// completion, together with the job's done mark and the InvoiceIssued outbox
// row.
package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/services/billing/internal/invoice"
)

// ErrNotFound is returned for an unknown invoice.
var ErrNotFound = errors.New("store: invoice not found")

// qInsertInvoice inserts an invoice and its lines in one statement. The
// number comes from invoice_number_seq in the same statement. ON CONFLICT on
// the unique work order id makes a second invoice for an order impossible
// (I3) and returns no row instead of aborting the transaction; the lease's
// fencing token already prevents it, this is the database's own guarantee.
const qInsertInvoice = `
WITH seq AS (SELECT nextval('invoice_number_seq') AS n),
inv AS (
    INSERT INTO invoices (id, number, work_order_id, customer_id, currency_code, total_minor,
                          issued_at, job_id, source_event)
    SELECT $1,
           'INV-' || to_char($6::timestamptz AT TIME ZONE 'UTC', 'YYYY') || '-'
               || lpad(n::text, greatest(6, length(n::text)), '0'),
           $2, $3, $4, $5, $6, $7, $8
    FROM seq
    ON CONFLICT (work_order_id) DO NOTHING
    RETURNING id, number
),
lines AS (
    INSERT INTO invoice_lines (invoice_id, line_no, description, quantity, unit_price_minor, amount_minor)
    SELECT inv.id, l.line_no, l.description, l.quantity, l.unit_price, l.amount
    FROM inv, unnest($9::int[], $10::text[], $11::int[], $12::bigint[], $13::bigint[])
        AS l(line_no, description, quantity, unit_price, amount)
)
SELECT number FROM inv`

// InsertInvoice inserts inv in tx and returns its number. inserted is false
// when the work order already has an invoice (nothing written).
func InsertInvoice(ctx context.Context, tx pgx.Tx, inv invoice.Invoice, jobID int64, sourceEvent string) (number string, inserted bool, err error) {
	n := len(inv.Lines)
	nos, descs, qtys, prices, amounts := make([]int32, n), make([]string, n), make([]int32, n), make([]int64, n), make([]int64, n)
	for i, l := range inv.Lines {
		nos[i], descs[i], qtys[i], prices[i], amounts[i] = int32(i+1), l.Description, l.Quantity, l.UnitPriceMinor, l.AmountMinor
	}
	err = tx.QueryRow(ctx, qInsertInvoice, inv.ID, inv.WorkOrderID, inv.CustomerID, inv.Currency, inv.TotalMinor,
		inv.IssuedAt, jobID, sourceEvent, nos, descs, qtys, prices, amounts).Scan(&number)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("store: insert invoice for order %s: %w", inv.WorkOrderID, err)
	}
	return number, true, nil
}

const qGet = `
SELECT id, number, work_order_id, customer_id, currency_code, total_minor, issued_at
FROM invoices WHERE id = $1`

// Get returns one invoice with its lines.
func Get(ctx context.Context, db pgdb.Executor, id uuid.UUID) (invoice.Invoice, error) {
	rows, err := db.Query(ctx, qGet, id)
	if err != nil {
		return invoice.Invoice{}, fmt.Errorf("store: get invoice: %w", err)
	}
	invs, err := pgx.CollectRows(rows, scanInvoice)
	if err != nil {
		return invoice.Invoice{}, fmt.Errorf("store: get invoice: %w", err)
	}
	if len(invs) == 0 {
		return invoice.Invoice{}, ErrNotFound
	}
	if err := withLines(ctx, db, invs); err != nil {
		return invoice.Invoice{}, err
	}
	return invs[0], nil
}

// Filter selects invoices for List. Zero fields do not filter.
type Filter struct {
	WorkOrderID  uuid.UUID
	IssuedAfter  time.Time // inclusive
	IssuedBefore time.Time // exclusive
	// After is the last invoice of the previous page (keyset), or nil.
	After *Cursor
	Limit int
	// Customers, when not nil, keeps only those customers' invoices (the
	// caller's, authz.Customers.IDs); nil: every customer's.
	Customers []string
}

// Cursor is a keyset position: the (issued_at, id) of the last row returned.
type Cursor struct {
	IssuedAt time.Time
	ID       uuid.UUID
}

// Token encodes c as an opaque page token.
func (c Cursor) Token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.IssuedAt.UnixMicro(), 10) + "|" + c.ID.String()))
}

// ParseToken decodes a page token.
func ParseToken(s string) (Cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Cursor{}, errors.New("malformed page token")
	}
	ts, id, ok := strings.Cut(string(raw), "|")
	if !ok {
		return Cursor{}, errors.New("malformed page token")
	}
	micros, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return Cursor{}, errors.New("malformed page token")
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return Cursor{}, errors.New("malformed page token")
	}
	return Cursor{IssuedAt: time.UnixMicro(micros).UTC(), ID: u}, nil
}

// qList pages newest first by (issued_at, id), the order of
// invoices_issued_idx; the row comparison is the keyset (stable under
// concurrent inserts, unlike OFFSET). A work order has at most one invoice,
// so that filter uses the unique index instead. The customers the caller
// acts for ($7; NULL: every one) filter in the query, so a page is full
// whenever more of the caller's invoices follow.
const qList = `
SELECT id, number, work_order_id, customer_id, currency_code, total_minor, issued_at
FROM invoices
WHERE ($1::uuid IS NULL OR work_order_id = $1)
  AND ($2::timestamptz IS NULL OR issued_at >= $2)
  AND ($3::timestamptz IS NULL OR issued_at < $3)
  AND ($4::timestamptz IS NULL OR (issued_at, id) < ($4, $5::uuid))
  AND ($7::text[] IS NULL OR customer_id = ANY($7))
ORDER BY issued_at DESC, id DESC
LIMIT $6`

// List returns a page of invoices and the cursor of the next page (nil at
// the end).
func List(ctx context.Context, db pgdb.Executor, f Filter) ([]invoice.Invoice, *Cursor, error) {
	var woID *uuid.UUID
	if f.WorkOrderID != uuid.Nil {
		woID = &f.WorkOrderID
	}
	var after, before, curTime *time.Time
	var curID *uuid.UUID
	if !f.IssuedAfter.IsZero() {
		after = &f.IssuedAfter
	}
	if !f.IssuedBefore.IsZero() {
		before = &f.IssuedBefore
	}
	if f.After != nil {
		curTime, curID = &f.After.IssuedAt, &f.After.ID
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 50
	}
	rows, err := db.Query(ctx, qList, woID, after, before, curTime, curID, limit+1, f.Customers)
	if err != nil {
		return nil, nil, fmt.Errorf("store: list invoices: %w", err)
	}
	invs, err := pgx.CollectRows(rows, scanInvoice)
	if err != nil {
		return nil, nil, fmt.Errorf("store: list invoices: %w", err)
	}
	var next *Cursor
	if len(invs) > limit {
		invs = invs[:limit]
		last := invs[limit-1]
		next = &Cursor{IssuedAt: last.IssuedAt, ID: last.ID}
	}
	if err := withLines(ctx, db, invs); err != nil {
		return nil, nil, err
	}
	return invs, next, nil
}

func scanInvoice(r pgx.CollectableRow) (invoice.Invoice, error) {
	var inv invoice.Invoice
	err := r.Scan(&inv.ID, &inv.Number, &inv.WorkOrderID, &inv.CustomerID, &inv.Currency, &inv.TotalMinor, &inv.IssuedAt)
	inv.IssuedAt = inv.IssuedAt.UTC()
	return inv, err
}

const qLines = `
SELECT invoice_id, description, quantity, unit_price_minor, amount_minor
FROM invoice_lines WHERE invoice_id = ANY($1) ORDER BY invoice_id, line_no`

func withLines(ctx context.Context, db pgdb.Executor, invs []invoice.Invoice) error {
	if len(invs) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(invs))
	byID := make(map[uuid.UUID]*invoice.Invoice, len(invs))
	for i := range invs {
		ids[i] = invs[i].ID
		byID[invs[i].ID] = &invs[i]
	}
	rows, err := db.Query(ctx, qLines, ids)
	if err != nil {
		return fmt.Errorf("store: invoice lines: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var l invoice.Line
		if err := rows.Scan(&id, &l.Description, &l.Quantity, &l.UnitPriceMinor, &l.AmountMinor); err != nil {
			return fmt.Errorf("store: invoice lines: %w", err)
		}
		if inv := byID[id]; inv != nil {
			inv.Lines = append(inv.Lines, l)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store: invoice lines: %w", err)
	}
	return nil
}
