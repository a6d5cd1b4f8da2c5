package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// beginTx returns the lock claim's transaction (ProcessBatch), opened
// with qBeginClaim's settings (plans pinned, application_name the relay id,
// bounded idle time). Nothing is sent yet: BEGIN and the settings go out in
// the claim's batch (qClaim), and the COMMIT in the batch that settles it
// (commitSettled), a pgdb.Tx's pipelining (ADR 0002, revision 5). A lease's
// transactions (lease.go) open the same way.
func (r *Relay) beginTx(ctx context.Context) (*pgdb.Tx, error) {
	tx, err := pgdb.Begin(ctx, r.pool, r.log)
	if err != nil {
		return nil, err
	}
	for _, q := range r.beginStmts[1:] { // [0] is the BEGIN, which tx sends
		tx.Queue(q)
	}
	return tx, nil
}

// The lease path's transactions (lease.go): opened like the lock claim's,
// with BEGIN and the settings queued, so that they ride the first batch.

// leaseLostMessage is qLeasePublish's failure when the lease was lost.
const leaseLostMessage = "outbox lease lost"

// publishLeased moves row to outbox_published and runs commit (nil: none)
// in one transaction. It returns errLeaseLost when the fence failed, a
// *commitError when commit did.
func (r *Relay) publishLeased(ctx context.Context, row leasedRow, commit Commit, now time.Time) error {
	tx, err := r.beginTx(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after the commit
	tx.Queue(r.q.leasePublish, row.ev.ID, row.token, now)
	if commit != nil {
		if err := commit(ctx, tx); err != nil {
			if leaseLost(err) {
				return errLeaseLost
			}
			return &commitError{err: fmt.Errorf("commit of event %s: %w", row.ev.ID, err)}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		if leaseLost(err) {
			return errLeaseLost
		}
		return err
	}
	return nil
}

// leaseLost tells whether err is qLeasePublish's failure on a lost lease
// (its pgdb.AssertSQL), an error of a batch, wrapped or not by the Commit
// that sent it.
func leaseLost(err error) bool { return pgdb.IsAssertion(err, leaseLostMessage) }

type commitError struct{ err error }

func (e *commitError) Error() string { return e.err.Error() }

// oneTrip runs the statements queue adds to a batch in a transaction opened
// like the lock claim's, in one round trip: BEGIN, the settings, the
// statements and COMMIT in one batch. Nothing outside the database happens
// inside it, and no result can stop its commit: a failing statement can
// (the server skips the rest of the batch, COMMIT included).
func (r *Relay) oneTrip(ctx context.Context, queue func(*pgx.Batch)) error {
	tx, err := r.beginTx(ctx)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	queue(b)
	if err = tx.CommitWith(ctx, b); err != nil {
		_ = tx.Rollback(ctx) // a no-op when the transaction ended
	}
	return err
}
