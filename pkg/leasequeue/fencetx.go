package leasequeue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// completeTx runs one completion transaction, a pgdb.Tx; errs receives
// ErrLeaseLost for fenced-off jobs. A returned error means nothing was
// committed, except for a failed Commit, whose outcome is unknown. The
// notifications the effects' writes announce (pgnotify.Notify, e.g. by
// outbox.Append) are sent after the commit, in the COMMIT's batch.
//
// It first expects every claim to hold its job (a lost lease is rare):
// BEGIN and the done mark go out with the effects' first statement, the
// done mark failing in the server, before that statement runs, if a claim
// does not hold its job (completeAllHeld). Then it starts over, learning
// which claims hold and running only their effects (completeHeld). Either
// way the effects commit in the done mark's transaction, or not at all.
func (q *Queue) completeTx(ctx context.Context, cs []completion, errs []error) error {
	jobs := make([]Job, len(cs))
	for i, c := range cs {
		jobs[i] = c.job
	}
	ids, epochs := idsEpochs(jobs)
	if !slices.ContainsFunc(cs, func(c completion) bool { return c.effects != nil }) {
		return q.markDone(ctx, cs, errs, ids, epochs)
	}
	if done, err := q.completeAllHeld(ctx, cs, ids, epochs); done || err != nil {
		return err
	}
	return q.completeHeld(ctx, cs, errs, ids, epochs)
}

// completeAllHeld is completeTx's first try: done reports false, with nothing
// committed, when a claim did not hold its job (or the done mark failed
// otherwise): the caller starts over with completeHeld. Round trips: BEGIN,
// the done mark and the effects' first statement in one batch, the effects'
// other statements, COMMIT and the wake-ups in one batch.
func (q *Queue) completeAllHeld(ctx context.Context, cs []completion, ids, epochs []int64) (done bool, err error) {
	tx, err := pgdb.Begin(ctx, q.pool, q.logger)
	if err != nil {
		return false, fmt.Errorf("leasequeue: complete: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op once committed
	marked := false
	tx.Queue(q.sql.completeAll, ids, epochs, q.now()).QueryRow(func(row pgx.Row) error {
		var n int64
		if err := row.Scan(&n); err != nil {
			return err
		}
		marked = true
		return nil
	})
	// markFailed: BEGIN and the done mark went out and the mark did not
	// hold (the effects' statement behind it never ran).
	markFailed := func() bool { return !marked && tx.Pending() == 0 }
	for _, c := range cs {
		if c.effects == nil {
			continue
		}
		if err := c.effects(ctx, tx); err != nil {
			if markFailed() {
				return false, nil
			}
			return false, effectError{err: err}
		}
	}
	if markFailed() { // an effect swallowed its statement's error
		return false, nil
	}
	if err := tx.Commit(ctx); err != nil {
		if markFailed() {
			return false, nil
		}
		return false, fmt.Errorf("leasequeue: complete: commit: %w", err)
	}
	q.countCompleted(ctx, cs, make([]error, len(cs)), len(cs))
	return true, nil
}

// completeHeld is completeTx's second try: BEGIN with qComplete, which
// returns the claims that hold their job (one batch), the effects of those
// alone, COMMIT with the wake-ups (one batch).
func (q *Queue) completeHeld(ctx context.Context, cs []completion, errs []error, ids, epochs []int64) error {
	tx, err := pgdb.Begin(ctx, q.pool, q.logger)
	if err != nil {
		return fmt.Errorf("leasequeue: complete: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op once committed
	var isHeld map[claim]bool
	b := &pgx.Batch{}
	b.Queue(q.sql.complete, ids, epochs, q.now()).Query(func(rows pgx.Rows) error {
		isHeld, err = collectClaims(rows)
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("leasequeue: complete: %w", err)
	}
	for i, c := range cs {
		if !isHeld[claimOf(c.job)] {
			errs[i] = ErrLeaseLost
			continue
		}
		if c.effects == nil {
			continue
		}
		if err := c.effects(ctx, tx); err != nil {
			return effectError{err: err}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("leasequeue: complete: commit: %w", err)
	}
	q.countCompleted(ctx, cs, errs, len(isHeld))
	return nil
}

// markDone completes jobs without effects: the fenced done mark alone, one
// statement and so its own transaction, with no BEGIN or COMMIT to send.
func (q *Queue) markDone(ctx context.Context, cs []completion, errs []error, ids, epochs []int64) error {
	rows, err := q.pool.Query(ctx, q.sql.complete, ids, epochs, q.now())
	if err != nil {
		return fmt.Errorf("leasequeue: complete: %w", err)
	}
	isHeld, err := collectClaims(rows)
	if err != nil {
		return fmt.Errorf("leasequeue: complete: %w", err)
	}
	for i, c := range cs {
		if !isHeld[claimOf(c.job)] {
			errs[i] = ErrLeaseLost
		}
	}
	q.countCompleted(ctx, cs, errs, len(isHeld))
	return nil
}

// countCompleted counts a committed completion: held jobs done, the others
// fenced off.
func (q *Queue) countCompleted(ctx context.Context, cs []completion, errs []error, held int) {
	q.m.completed.Add(ctx, int64(held), q.m.attrs)
	for i, c := range cs {
		if errors.Is(errs[i], ErrLeaseLost) {
			q.m.fenced.Add(ctx, 1, q.m.attrs)
			q.logger.Warn("completion fenced off: lease lost to another claim; nothing committed",
				"job_id", c.job.ID, "stale_epoch", c.job.Epoch, "owner", c.job.Owner)
		}
	}
}
