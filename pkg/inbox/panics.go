package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// A handler that panics is recovered, charged an attempt and, after
// Config.MaxAttempts, parked: it never stops the relay or its batch-mates.

// ReasonPanic parks an entry whose handler panicked on each of
// Config.MaxAttempts attempts; last_error holds "panic: <value>", the
// relay's log the stack.
const ReasonPanic = "PANIC"

// panicError is a recovered handler panic; its message starts "panic: ".
type panicError struct {
	value any
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }

// lostPanicError is a panic after which the savepoint could not be rolled
// back (e.g. the handler left a query result unread): the claim transaction
// is unusable and its batch rolls back, the entry's attempt with it.
type lostPanicError struct {
	entry Entry
	panic *panicError
	err   error
}

func (e *lostPanicError) Error() string {
	return fmt.Sprintf("inbox: entry %d: %v; transaction lost: %v", e.entry.ID, e.panic, e.err)
}
func (e *lostPanicError) Unwrap() error { return e.err }

// recovered turns a recovered panic value into a panicError, counted and
// logged with its stack.
func (r *Relay) recovered(ctx context.Context, p any, attrs ...any) error {
	r.m.panics.Add(ctx, 1)
	r.logger.ErrorContext(ctx, "inbox relay: handler panicked",
		append(attrs, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))...)
	return &panicError{value: p}
}

// handle runs the handler for one entry, recovering a panic as its error.
func (r *Relay) handle(ctx context.Context, tx pgx.Tx, e *Entry) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = r.recovered(ctx, p, "inbox_id", e.ID, "event_id", e.EventID, "event_type", e.EventType)
		}
	}()
	return r.handler.Handle(ctx, tx, e)
}

// handleBatch runs HandleBatch, recovering a panic as a failure of the whole
// batch: the entry-by-entry fallback then finds the entry that panics.
func (r *Relay) handleBatch(ctx context.Context, tx pgx.Tx, bh BatchHandler, es []*Entry) (res []error, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, r.recovered(ctx, p, "batch_size", len(es))
		}
	}()
	return bh.HandleBatch(ctx, tx, es)
}

// lockUnchanged locks an entry if it is still OPEN, untouched since it was
// claimed (same attempts), and not being applied by another relay.
const lockUnchanged = `
SELECT id FROM {schema}.inbox
WHERE id = $1 AND status = 'OPEN' AND attempts = $2
FOR UPDATE SKIP LOCKED`

// chargeLostPanic records the attempt of a panic whose transaction was lost,
// in a transaction of its own. An entry another relay has meanwhile claimed
// or resolved is left to it.
func (r *Relay) chargeLostPanic(ctx context.Context, lost *lostPanicError) error {
	r.logger.WarnContext(ctx, "inbox relay: a panic lost the batch's transaction; charging the entry alone",
		"inbox_id", lost.entry.ID, "event_id", lost.entry.EventID, "error", lost.err)
	var o outcome
	err := pgdb.InTx(ctx, r.pool, r.logger, func(tx *pgdb.Tx) error {
		var id int64
		err := tx.QueryRow(ctx, r.q.lockUnchanged, lost.entry.ID, lost.entry.Attempts).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		o = r.outcome(ctx, &lost.entry, lost.panic)
		return r.resolve(ctx, tx, []outcome{o})
	})
	if err != nil {
		return fmt.Errorf("inbox: charge panic of entry %d: %w", lost.entry.ID, err)
	}
	if o.id != 0 {
		r.record(ctx, []Entry{lost.entry}, []outcome{o})
	}
	return nil
}
