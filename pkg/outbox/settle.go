package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// settle records the outcome of a batch and commits it, in one round trip
// when no event carries a Commit (commitSettled): published rows move to
// outbox_published, failed ones are updated, released ones are left alone,
// and the batch's journal rows are deleted.
//
// Commits run first, in a savepoint that goes out with the first statement
// they send; the settlement follows in the batch that commits. When a
// Commit fails, or the settlement after them does, the work is rolled back
// to that savepoint (the row locks are kept) and each row is moved with its
// Commit alone, so one bad Commit does not hold back the others; a row
// whose own Commit fails becomes a transient failure. Savepoints cost a
// subtransaction each: one per batch with Commits, one per row only on this
// rare path, each released; the batch's own is released by the COMMIT.
func (r *Relay) settle(ctx context.Context, tx *pgdb.Tx, rows []claimedRow, outs []outcome, j *journal) error {
	now := r.now()
	var (
		published []int
		sp        *pgdb.Tx
	)
	for i := range outs {
		if outs[i].kind == outcomePublished {
			published = append(published, i)
			if outs[i].commit != nil && sp == nil {
				sp = tx.Savepoint()
			}
		}
	}
	if sp == nil {
		return r.commitSettled(ctx, tx, rows, outs, published, j, now)
	}
	err := r.runCommits(ctx, sp, rows, outs, published)
	if err == nil {
		if err = r.commitSettled(ctx, tx, rows, outs, published, j, now); err == nil || tx.Closed() {
			return err
		}
	}
	if ctx.Err() != nil || tx.Conn().IsClosed() {
		return fmt.Errorf("outbox: mark published: %w", err)
	}
	if rerr := sp.Rollback(ctx); rerr != nil || tx.Conn().PgConn().TxStatus() != 'T' {
		// An aborted transaction with no savepoint to go back to: the
		// settlement itself failed, not a Commit.
		return fmt.Errorf("outbox: mark published: %w", errors.Join(err, rerr))
	}
	r.log.Warn("outbox batch mark failed; marking one by one", "error", err, "rows", len(published))
	for _, i := range published {
		err := pgdb.InTx(ctx, tx, r.log, func(sp *pgdb.Tx) error { return r.moveAndCommit(ctx, sp, rows, outs, []int{i}, now) })
		if err != nil {
			if ctx.Err() != nil || tx.Conn().IsClosed() {
				return fmt.Errorf("outbox: mark published: %w", err)
			}
			outs[i] = outcome{kind: outcomeRetry, err: fmt.Errorf("commit after dispatch: %w", err)}
		}
	}
	return r.commitSettled(ctx, tx, rows, outs, nil, j, now)
}

// runCommits runs the Commits of rows[idx] in tx.
func (r *Relay) runCommits(ctx context.Context, tx pgx.Tx, rows []claimedRow, outs []outcome, idx []int) error {
	for _, i := range idx {
		if c := outs[i].commit; c != nil {
			if err := c(ctx, tx); err != nil {
				return fmt.Errorf("commit of event %s: %w", rows[i].ev.ID, err)
			}
		}
	}
	return nil
}

func (r *Relay) moveAndCommit(ctx context.Context, tx pgx.Tx, rows []claimedRow, outs []outcome, idx []int, now time.Time) error {
	if _, err := tx.Exec(ctx, r.q.markPublished, publishedTIDs(rows, idx), now); err != nil {
		return fmt.Errorf("outbox: mark published: %w", err)
	}
	return r.runCommits(ctx, tx, rows, outs, idx)
}

func publishedTIDs(rows []claimedRow, idx []int) []pgtype.TID {
	tids := make([]pgtype.TID, len(idx))
	for k, i := range idx {
		tids[k] = rows[i].tid
	}
	return tids
}

// commitSettled sends, with the COMMIT, qMarkPublished for rows[published]
// (none: moved already), qMarkUnpublished for the failed rows and
// qJournalDone for the batch's journal rows. qMarkPublished fails in the
// server when it moves fewer rows than it was given, so such a batch is not
// committed (pgdb.Tx.CommitWith).
func (r *Relay) commitSettled(ctx context.Context, tx *pgdb.Tx, rows []claimedRow, outs []outcome, published []int, j *journal, now time.Time) error {
	b := &pgx.Batch{}
	if len(published) > 0 {
		queueExec(b, "mark published", r.q.markPublished, publishedTIDs(rows, published), now)
	}
	r.queueMarkUnpublished(b, rows, outs, now)
	queueExec(b, "journal", r.q.journalDone, j.settledIDs())
	if err := tx.CommitWith(ctx, b); err != nil {
		return fmt.Errorf("outbox: commit batch: %w", err)
	}
	return nil
}

// queueExec queues sql on b, its error prefixed with what.
func queueExec(b *pgx.Batch, what, sql string, args ...any) {
	b.Queue(sql, args...).Fn = func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("outbox: %s: %w", what, err)
		}
		return nil
	}
}

// queueMarkUnpublished queues qMarkUnpublished for the failed rows, if any.
func (r *Relay) queueMarkUnpublished(b *pgx.Batch, rows []claimedRow, outs []outcome, now time.Time) {
	var (
		tids   []pgtype.TID
		ids    []int64
		status []string
		errs   []string
		nexts  []*time.Time
	)
	for i, o := range outs {
		if o.kind == outcomePublished || o.kind == outcomeReleased || o.kind == outcomeUnavailable {
			continue // an outage is not the event's fault: no attempt, no backoff
		}
		ev := rows[i].ev
		msg := truncate(o.err.Error(), 2000)
		switch {
		case o.kind == outcomeFailed:
		case ev.Attempts >= r.cfg.MaxAttempts:
			msg = fmt.Sprintf("attempts exhausted (%d): %s", ev.Attempts, msg)
		default:
			next := now.Add(r.policy.Delay(ev.Attempts))
			tids, ids, status, errs, nexts = append(tids, rows[i].tid), append(ids, rows[i].id), append(status, "PENDING"), append(errs, msg), append(nexts, &next)
			continue
		}
		tids, ids, status, errs, nexts = append(tids, rows[i].tid), append(ids, rows[i].id), append(status, "FAILED"), append(errs, msg), append(nexts, nil)
	}
	if len(ids) > 0 {
		queueExec(b, "mark unpublished", r.q.markUnpublished, ids, status, errs, nexts, tids)
	}
}

// truncate cuts s to at most n bytes on a rune boundary: a cut inside a
// multi-byte character would be invalid UTF-8, which PostgreSQL rejects,
// failing the statement that records the whole batch.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
