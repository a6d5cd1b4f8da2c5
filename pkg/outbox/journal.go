package outbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The dispatch journal charges an attempt to an event whose dispatch kills
// the relay process. A crash rolls the claim transaction back, so the
// outbox row cannot record that attempt; a journal row committed on its own
// (outbox_dispatching, migrations/00001_outbox.sql) survives the crash:
//
//  1. Before dispatching a claimed batch, the relay records its event ids in
//     one autonomous statement, which also returns the journal rows left
//     behind for any of those ids. Such a row's batch is over (this claim
//     holds the ids' locks) but was never settled: its relay died or rolled
//     back mid-batch.
//  2. An event named by a row left behind is a suspect. A batch with a
//     suspect is dispatched one event at a time, with nothing else of this
//     relay in flight, under one "exclusive" journal row that is pointed at
//     each event before its dispatch.
//  3. An exclusive row left behind names the event whose dispatch was the
//     only one in flight when the process died: the next claim charges that
//     event an attempt, in the claim transaction, and the event goes to
//     FAILED at MaxAttempts like any other. Later events of its aggregate
//     claimed with it are released undispatched.
//  4. Settling a batch deletes its journal rows (and the rows it consumed)
//     in the claim transaction, atomically with the outcome.
//
// The common path costs one statement on a second connection per batch, on
// an unlogged table (no WAL, no fsync), and one DELETE in the claim
// transaction.
//
// That second connection never comes from the relay's pool: a batch holds a
// pooled connection (its claim) while it waits for the journal's, so with
// every pooled connection in a claim no batch could go on until the lease
// expired. The journal has a pool of its own (newJournalPool), one
// connection per batch in flight, whose statements wait for nothing else.

// qJournal records a batch about to be dispatched ($1 ids in ascending
// order, $2 exclusive, $3 relay id) and returns the journal rows left behind
// for those ids; the insert is not visible to the statement's own SELECT.
// Runs outside the claim transaction (autocommit), so it survives the
// process. Every row's ids ascend too, so comparing first and last ids
// skips the rows of other batches in flight before the overlap test, which
// compares every pair of elements (without the range test B1 measured the
// relay at about 0.8x its rate; with it, within the benchmark's noise).
const qJournal = `
WITH started AS (
    INSERT INTO {schema}.outbox_dispatching (ids, exclusive, relay_id) VALUES ($1, $2, $3)
    RETURNING batch_id
)
SELECT s.batch_id, d.batch_id, d.ids, d.exclusive
FROM started s
LEFT JOIN {schema}.outbox_dispatching d
       ON d.ids[1] <= $1[cardinality($1::bigint[])]
      AND d.ids[cardinality(d.ids)] >= $1[1]
      AND d.ids && $1::bigint[]`

// qJournalMove points a batch's exclusive row at the next event it
// dispatches alone: the row names only the dispatch in flight, so a crash is
// charged to that event and not to the ones dispatched before it.
const qJournalMove = `UPDATE {schema}.outbox_dispatching SET ids = $2 WHERE batch_id = $1`

// qJournalDone deletes settled (and consumed) journal rows, in the claim
// transaction. The primary key makes it an index probe per row.
const qJournalDone = `DELETE FROM {schema}.outbox_dispatching WHERE batch_id = ANY($1::bigint[])`

// qJournalGC deletes rows left behind that no claim consumed (their events
// were claimed in other combinations and have left the outbox). Rows younger
// than two leases may belong to a batch still in flight.
const qJournalGC = `
DELETE FROM {schema}.outbox_dispatching d
WHERE d.started_at < now() - make_interval(secs => $1)
  AND NOT EXISTS (SELECT 1 FROM {schema}.outbox o WHERE o.id = ANY(d.ids) AND o.status = 'PENDING')`

// qChargeCrashes charges the claimed rows whose dispatch killed a relay:
// attempts grow by the crashes, the status is PENDING or FAILED as the relay
// decided. The rows are locked by the claim; addressed by ctid as in
// qMarkUnpublished, and their new ctid is returned for the statements that
// settle them.
const qChargeCrashes = `
UPDATE {schema}.outbox o
SET attempts = o.attempts + u.crashes,
    status = u.status,
    last_error = u.err
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[]) AS u(id, crashes, status, err)
WHERE o.ctid = ANY($5::tid[]) AND o.id = u.id AND o.status = 'PENDING'
RETURNING o.id, o.ctid`

// newJournalPool opens (lazily: no connection until the first statement) a
// pool of up to conns connections to the relay's database for the journal.
func (r *Relay) newJournalPool(conns int) (*pgxpool.Pool, error) {
	cfg := r.pool.Config()
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = int32(conns), 0, 0
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("outbox: journal pool: %w", err)
	}
	return p, nil
}

// journal is what a claim learnt from the journal.
type journal struct {
	// db runs the journal's autonomous statements: the journal's pool,
	// never the pool of the claim transactions.
	db *pgxpool.Pool
	// created are this batch's journal rows, consumed the rows left behind
	// that it settles: both are deleted when the batch settles. If it does
	// not settle, only created ones are forgotten; the consumed ones keep
	// what they say for the next claim.
	created, consumed []int64
	// suspects: claimed ids named by a row left behind.
	suspects map[int64]bool
	// crashes: claimed ids named by exclusive rows left behind, and how many.
	crashes map[int64]int
}

// settledIDs are the journal rows the batch's settlement deletes.
func (j *journal) settledIDs() []int64 { return append(slices.Clip(j.created), j.consumed...) }

func (j *journal) known(batchID int64) bool {
	return slices.Contains(j.created, batchID) || slices.Contains(j.consumed, batchID)
}

// openJournal records the claimed rows in the journal (journalStart),
// through Run's journal pool or, outside Run, a pool of its own. end, called
// once the batch is over, forgets the journal rows of a batch that did not
// settle and closes that pool.
func (r *Relay) openJournal(ctx, tctx context.Context, rows []claimedRow) (j *journal, end func(settled bool), err error) {
	jp := r.journalPool.Load()
	closePool := func() {}
	if jp == nil { // outside Run
		if jp, err = r.newJournalPool(1); err != nil {
			return nil, nil, err
		}
		closePool = jp.Close // after forget
	}
	j = &journal{db: jp, suspects: map[int64]bool{}, crashes: map[int64]int{}}
	ids := make([]int64, len(rows))
	for i := range rows {
		ids[i] = rows[i].id
	}
	if err := r.journalStart(tctx, ids, false, j); err != nil {
		r.forget(ctx, j)
		closePool()
		return nil, nil, err
	}
	return j, func(settled bool) {
		if !settled {
			r.forget(ctx, j)
		}
		closePool()
	}, nil
}

// journalStart runs qJournal for ids and sorts the rows left behind. A row
// left behind is consumed when the claim holds every id it names (it will
// settle all of them); otherwise qJournalGC removes it later.
func (r *Relay) journalStart(ctx context.Context, ids []int64, exclusive bool, j *journal) error {
	rows, err := j.db.Query(ctx, r.q.journal, ids, exclusive, r.cfg.RelayID)
	if err != nil {
		return fmt.Errorf("outbox: journal: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			own     int64
			leftID  *int64
			leftIDs []int64
			excl    *bool
		)
		if err := rows.Scan(&own, &leftID, &leftIDs, &excl); err != nil {
			return fmt.Errorf("outbox: journal: %w", err)
		}
		if !j.known(own) {
			j.created = append(j.created, own)
		}
		if leftID == nil || j.known(*leftID) {
			continue
		}
		covered := true
		for _, id := range leftIDs {
			if !slices.Contains(ids, id) {
				covered = false
				continue
			}
			j.suspects[id] = true
			if *excl {
				j.crashes[id]++
			}
		}
		if covered {
			j.consumed = append(j.consumed, *leftID)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: journal: %w", err)
	}
	return nil
}

// chargeCrashes charges the crashes j found to their rows, in the claim
// transaction, and returns the rows still to dispatch; those that reach
// MaxAttempts are FAILED and left out.
func (r *Relay) chargeCrashes(ctx context.Context, tx pgx.Tx, rows []claimedRow, j *journal) ([]claimedRow, error) {
	if len(j.crashes) == 0 {
		return rows, nil
	}
	var (
		ids      []int64
		crashes  []int32
		statuses []string
		errs     []string
		tids     []pgtype.TID
		failed   = map[int64]bool{}
	)
	for _, row := range rows {
		n := j.crashes[row.id]
		if n == 0 {
			continue
		}
		done := row.ev.Attempts - 1 + n // failed attempts once charged
		msg := fmt.Sprintf("relay process died while dispatching this event (%d times in a row)", n)
		status := "PENDING"
		if done >= r.cfg.MaxAttempts {
			status, msg = "FAILED", fmt.Sprintf("attempts exhausted (%d): %s", done, msg)
			failed[row.id] = true
		}
		ids, crashes, statuses, errs, tids = append(ids, row.id), append(crashes, int32(n)), append(statuses, status), append(errs, msg), append(tids, row.tid)
		r.log.Error("outbox event killed the relay process while dispatching; attempt charged", "event_id", row.ev.ID,
			"event_type", row.ev.Type, "aggregate_id", row.ev.AggregateID, "attempts", done, "status", status)
	}
	res, err := tx.Query(ctx, r.q.chargeCrashes, ids, crashes, statuses, errs, tids)
	if err != nil {
		return nil, fmt.Errorf("outbox: charge crashes: %w", err)
	}
	newTID := map[int64]pgtype.TID{}
	for res.Next() {
		var id int64
		var tid pgtype.TID
		if err := res.Scan(&id, &tid); err != nil {
			res.Close()
			return nil, fmt.Errorf("outbox: charge crashes: %w", err)
		}
		newTID[id] = tid
	}
	res.Close()
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("outbox: charge crashes: %w", err)
	}
	if len(newTID) != len(ids) {
		return nil, fmt.Errorf("outbox: charge crashes: updated %d of %d locked rows", len(newTID), len(ids))
	}
	// A FAILED event blocks the later events of its aggregate, even those
	// claimed with it: they are released undispatched.
	kept := rows[:0:0]
	blocked := map[string]bool{}
	for _, row := range rows {
		if blocked[row.ev.AggregateID] {
			continue
		}
		if n := j.crashes[row.id]; n > 0 {
			if failed[row.id] {
				r.m.failed.Add(ctx, 1, metric.WithAttributes(attribute.String("event_type", row.ev.Type)))
				blocked[row.ev.AggregateID] = true
				continue
			}
			row.tid, row.ev.Attempts = newTID[row.id], row.ev.Attempts+n
		}
		kept = append(kept, row)
	}
	return kept, nil
}

// dispatchAlone dispatches a batch with suspects: one event at a time, with
// no other batch of this relay in flight, after pointing the batch's
// exclusive journal row at it, so that a crash names its event. Events of
// one aggregate keep their order and stop at the first failure. If the
// journal cannot be written, the rest of the batch is released undispatched.
func (r *Relay) dispatchAlone(ctx, tctx context.Context, rows []claimedRow, j *journal) []outcome {
	r.inFlight.Lock()
	defer r.inFlight.Unlock()
	out := make([]outcome, len(rows))
	stopped := map[string]bool{}
	var alone int64 // the exclusive row, once created
	for i, row := range rows {
		if ctx.Err() != nil {
			break
		}
		if stopped[row.ev.AggregateID] {
			continue
		}
		var err error
		if alone == 0 {
			if err = r.journalStart(tctx, []int64{row.id}, true, j); err == nil {
				alone = j.created[len(j.created)-1]
			}
		} else {
			_, err = j.db.Exec(tctx, r.q.journalMove, alone, []int64{row.id})
		}
		if err != nil {
			r.log.Warn("outbox journal failed; releasing the rest of the batch", "error", err)
			break
		}
		out[i] = r.dispatchOne(ctx, row.ev)
		if out[i].kind != outcomePublished {
			stopped[row.ev.AggregateID] = true
		}
	}
	return out
}

// forget deletes journal rows of a batch that did not settle, so that its
// events are not suspected without cause. Best effort: if it fails, the
// next claim treats them as suspects, which costs time, not correctness.
func (r *Relay) forget(ctx context.Context, j *journal) {
	if len(j.created) == 0 {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := j.db.Exec(fctx, r.q.journalDone, j.created); err != nil {
		r.log.Warn("outbox journal rows of an unsettled batch not deleted; its events will be dispatched one by one", "error", err)
	}
}

// collectJournal deletes journal rows left behind that no claim consumed.
func (r *Relay) collectJournal(ctx context.Context) error {
	if _, err := r.pool.Exec(ctx, r.q.journalGC, (2 * r.cfg.LeaseDuration).Seconds()); err != nil {
		return fmt.Errorf("outbox: journal cleanup: %w", err)
	}
	return nil
}
