package handoff

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// withSave runs the first statement sent through it in one batch after the
// statements of save (an order's QueueSave), and the others alone on tx:
// inbox.MakeDue's statement rides the order's save, in the same order as
// sent one after the other. If save fails, so does that statement.
type withSave struct {
	tx   pgx.Tx
	save *pgx.Batch
	sent bool
}

func (w *withSave) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if w.sent {
		return w.tx.Exec(ctx, sql, args...)
	}
	w.sent = true
	var tag pgconn.CommandTag
	w.save.Queue(sql, args...).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	err := w.tx.SendBatch(ctx, w.save).Close()
	return tag, err
}

func (w *withSave) flush(ctx context.Context) error {
	if w.sent || w.save.Len() == 0 {
		w.sent = true
		return nil
	}
	w.sent = true
	return w.tx.SendBatch(ctx, w.save).Close()
}

func (w *withSave) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := w.flush(ctx); err != nil {
		return nil, err
	}
	return w.tx.Query(ctx, sql, args...)
}

func (w *withSave) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := w.flush(ctx); err != nil {
		return errRow{err}
	}
	return w.tx.QueryRow(ctx, sql, args...)
}

func (w *withSave) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !w.sent {
		w.sent = true
		w.save.QueuedQueries = append(w.save.QueuedQueries, b.QueuedQueries...)
		return w.tx.SendBatch(ctx, w.save)
	}
	return w.tx.SendBatch(ctx, b)
}

// errRow is the Row of a QueryRow whose save failed.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
