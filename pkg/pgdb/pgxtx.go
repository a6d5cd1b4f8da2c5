package pgdb

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The rest of pgx.Tx, so that a Tx goes wherever a pgx.Tx or a DB does: each
// method sends what is queued with its own statement when it can share the
// batch, and first on its own when it cannot.

// SendBatch sends the queued statements and b's in one batch. The returned
// results are b's: those of the queued statements are read (their
// callbacks run) before b's first.
func (tx *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if tx.Closed() {
		return errBatch{pgx.ErrTxClosed}
	}
	tx.enter()
	r := tx.top()
	queued := r.pending
	if len(queued) > 0 {
		b = &pgx.Batch{QueuedQueries: append(slices.Clip(queued), b.QueuedQueries...)}
		r.pending, r.begun = nil, true
	}
	return &results{br: r.conn.SendBatch(ctx, b), tx: r, queued: queued}
}

func (tx *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if tx.Closed() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	tx.enter()
	if !batchable(args) {
		if err := tx.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return tx.top().conn.Exec(ctx, sql, args...)
	}
	if len(tx.top().pending) == 0 {
		return tx.top().conn.Exec(ctx, sql, args...)
	}
	var tag pgconn.CommandTag
	b := &pgx.Batch{}
	b.Queue(sql, args...).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	err := tx.SendBatch(ctx, b).Close()
	return tag, err
}

// Query sends the queued statements alone first: the rows of a batch
// carrying them would have to be read before the batch's end.
func (tx *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if tx.Closed() {
		return nil, pgx.ErrTxClosed
	}
	tx.enter()
	if err := tx.flush(ctx); err != nil {
		return nil, err
	}
	return tx.top().conn.Query(ctx, sql, args...)
}

func (tx *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if tx.Closed() {
		return errRow{pgx.ErrTxClosed}
	}
	tx.enter()
	if len(tx.top().pending) == 0 || !batchable(args) {
		if err := tx.flush(ctx); err != nil {
			return errRow{err}
		}
		return tx.top().conn.QueryRow(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := tx.SendBatch(ctx, b)
	return batchRow{row: br.QueryRow(), br: br}
}

func (tx *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if tx.Closed() {
		return 0, pgx.ErrTxClosed
	}
	tx.enter()
	if err := tx.flush(ctx); err != nil {
		return 0, err
	}
	return tx.top().conn.CopyFrom(ctx, table, columns, src)
}

// LargeObjects is not available: pgx builds its LargeObjects only on its own
// transactions.
func (tx *Tx) LargeObjects() pgx.LargeObjects {
	panic("pgdb: large objects are not available in a pgdb.Tx")
}

// Prepare names a statement on the connection; it needs no transaction.
func (tx *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return tx.top().conn.Prepare(ctx, name, sql)
}
