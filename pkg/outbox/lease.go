package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// Slow mode (WithSlowDispatch): the claim writes a lease and commits, each
// event is dispatched outside any transaction and settled by a short
// transaction of its own as soon as its dispatch ends. Against a destination
// answering in hundreds of milliseconds and sometimes not at all, the lock
// claim's batch lasts as long as its slowest dispatch and its other workers
// idle behind it; here a finished worker takes the next event at once.
//
// Crash charging follows the dispatch journal's reasoning (journal.go), with
// the committed lease as the record that survives the crash. A lease found
// expired means its relay died or overran the lease mid-dispatch. If other
// events were in flight in that process, the death cannot be blamed on this
// one: it is charged nothing and becomes a suspect. Suspects are leased
// "alone" and dispatched one at a time with nothing else in flight in the
// relay's process; an alone lease found expired names the event whose
// dispatch died, and charges it an attempt (FAILED at MaxAttempts). A poison
// therefore ends FAILED after at most MaxAttempts + 1 crashes, as with the
// journal, and an event merely in flight beside it is never charged.

// errDiedDispatching is recorded as last_error when a claim finds an
// expired lease.
const errDiedDispatching = "relay died while dispatching (lease expired before the outcome was recorded)"

// leasedRow is an event claimed with a lease; token fences its settlement.
type leasedRow struct {
	claimedRow
	token string
}

// slowLoop keeps up to SlowDispatchConcurrency leased events in flight: it
// claims as many as there are free workers, then waits until a worker
// finishes (its aggregate's next event may now be claimable), a NOTIFY
// arrives or PollInterval passes. Every SweepInterval it looks for expired
// leases; when there are, it stops claiming, lets its workers finish and
// dispatches the suspects one at a time, alone. On shutdown the dispatches
// are cut off and every worker records or releases its event before Run
// returns.
func (r *Relay) slowLoop(ctx context.Context) {
	n := r.cfg.SlowDispatchConcurrency
	done := make(chan struct{}, n) // one send per worker; never blocks
	inFlight := 0
	defer func() {
		for ; inFlight > 0; inFlight-- {
			<-done
		}
	}()
	var (
		failures  int
		suspects  bool
		lastCheck time.Time
	)
	fail := func(err error) {
		failures++
		delay := r.failureWait(err, failures)
		r.log.Warn("outbox lease claim failed; backing off", "error", err, "attempt", failures, "delay", delay)
		sleep(ctx, delay)
	}
	r.endPredecessorLeases(ctx)
	for ctx.Err() == nil {
		if !suspects && time.Since(lastCheck) >= r.cfg.SweepInterval {
			lastCheck = time.Now()
			var err error
			if suspects, err = r.leasesExpired(ctx); err != nil {
				fail(err)
				continue
			}
		}
		if suspects && inFlight == 0 {
			rows, found, err := r.claimSuspect(ctx)
			if err != nil {
				fail(err)
				continue
			}
			failures = 0
			suspects = found
			for _, row := range rows {
				// Nothing else of this process dispatches meanwhile, lock-claim
				// batches included, so that a crash now is this event's.
				r.inFlight.Lock()
				r.dispatchLeased(ctx, row)
				r.inFlight.Unlock()
			}
			continue
		}
		if free := n - inFlight; free > 0 && !suspects {
			rows, err := r.claimLeases(ctx, free)
			if err != nil {
				fail(err)
				continue
			}
			failures = 0
			for _, row := range rows {
				inFlight++
				go func() {
					defer func() { done <- struct{}{} }()
					r.inFlight.RLock()
					defer r.inFlight.RUnlock()
					r.dispatchLeased(ctx, row)
				}()
			}
		}
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-done:
			inFlight--
			for drained := false; !drained; { // claim once for every worker that is free by now
				select {
				case <-done:
					inFlight--
				default:
					drained = true
				}
			}
		case <-r.slowWake:
		case <-t.C:
		}
		t.Stop()
	}
}

// slowClaimable lists the slow types whose circuit lets them be claimed.
func (r *Relay) slowClaimable(now time.Time) []string {
	var types []string
	for _, typ := range r.slowTypes {
		if r.circuits[typ].Claimable(now) {
			types = append(types, typ)
		}
	}
	return types
}

// endPredecessorLeases ends the leases a dead process with this relay's id
// left behind (qLeaseEndPredecessor): the instance restarted after a kill
// or a crash, and its events need not wait out the rest of their leases (30
// s by default). Relay ids must be unique among live relays: a live relay
// with the same id would have its events taken over, which the fence keeps
// to a second dispatch. A failure is logged, not fatal: the leases then run
// out as they would have.
func (r *Relay) endPredecessorLeases(ctx context.Context) {
	tag, err := r.pool.Exec(ctx, r.q.leaseEndPredecessor, r.slowTypes, r.cfg.RelayID+"/", r.now())
	switch {
	case err != nil:
		r.log.Warn("outbox: the leases of this relay's previous process not ended; they expire on their own", "error", err)
	case tag.RowsAffected() > 0:
		r.log.Warn("outbox: ended the leases of this relay's previous process; their events are dispatched again, one at a time",
			"leases", tag.RowsAffected())
	}
}

// leasesExpired reports whether a lease of the slow types has expired.
func (r *Relay) leasesExpired(ctx context.Context) (bool, error) {
	var expired bool
	if err := r.pool.QueryRow(ctx, r.q.leaseExpired, r.slowTypes, r.now()).Scan(&expired); err != nil {
		return false, fmt.Errorf("outbox: lease probe: %w", err)
	}
	return expired, nil
}

// claimLeases leases up to limit claimable events of the slow types, in a
// transaction that commits before they are dispatched.
func (r *Relay) claimLeases(ctx context.Context, limit int) ([]leasedRow, error) {
	now := r.now()
	types := r.slowClaimable(now)
	if len(types) == 0 {
		return nil, nil
	}
	rows, _, err := r.lease(ctx, now, r.q.leaseClaim, types, now, limit)
	return rows, err
}

// claimSuspect leases one event whose lease expired, alone; found is false
// when there was none. One whose last attempt the expiry used up is moved
// to FAILED by the same statement and not returned (found, rows empty).
func (r *Relay) claimSuspect(ctx context.Context) (rows []leasedRow, found bool, err error) {
	now := r.now()
	rows, failed, err := r.lease(ctx, now, r.q.leaseClaimSuspect, r.slowTypes, now)
	return rows, len(rows)+failed > 0, err
}

// lease runs a lease claim; args are the statement's arguments before the
// token and the lease's end (qLeaseClaimSuspect's are followed by
// MaxAttempts and the reason of a charged death).
func (r *Relay) lease(ctx context.Context, now time.Time, query string, args ...any) (_ []leasedRow, failedN int, _ error) {
	token := r.cfg.RelayID + "/" + strconv.FormatInt(r.leaseSeq.Add(1), 10)
	args = append(args, token, now.Add(r.cfg.LeaseDuration))
	if query == r.q.leaseClaimSuspect {
		args = append(args, r.cfg.MaxAttempts, errDiedDispatching)
	}
	var (
		out    []leasedRow
		failed []Event
	)
	// BEGIN, the settings, the claim and COMMIT in one round trip: nothing
	// is decided between the claim and its commit. A row the scan below
	// rejects is leased nonetheless and comes back when its lease expires.
	err := r.oneTrip(ctx, func(b *pgx.Batch) {
		b.Queue(query, args...).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var (
					row       leasedRow
					sv, att   int32
					headers   []byte
					exhausted bool
				)
				ev := &row.ev
				if err := rows.Scan(&row.id, &ev.ID, &ev.AggregateType, &ev.AggregateID, &ev.Type, &sv,
					&ev.Payload, &headers, &ev.OccurredAt, &att, &exhausted); err != nil {
					return err
				}
				ev.SchemaVersion, ev.Attempts = int(sv), int(att)
				if exhausted {
					failed = append(failed, *ev)
					continue
				}
				var err error
				if ev.Headers, err = decodeHeaders(headers); err != nil {
					r.log.Warn("outbox event with unreadable headers; dispatching without them", "event_id", ev.ID, "error", err)
				}
				row.token = token
				out = append(out, row)
			}
			return rows.Err()
		})
	})
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: lease claim: %w", err)
	}
	for _, ev := range failed {
		typ := attribute.String("event_type", ev.Type)
		r.m.errors.Add(ctx, 1, metric.WithAttributes(typ, attribute.String("error.kind", "crash")))
		r.m.failed.Add(ctx, 1, metric.WithAttributes(typ))
		r.log.Error("outbox event moved to FAILED: its relay died while dispatching it, attempts exhausted",
			"event_id", ev.ID, "event_type", ev.Type, "aggregate_id", ev.AggregateID, "attempt", ev.Attempts-1)
	}
	return out, len(failed), nil
}

// dispatchLeased dispatches one leased event and records its outcome. The
// dispatch is cut off at 80% of the lease, counted from the claim, so the
// settlement normally lands within the lease; if it does not, the fence
// makes it a no-op and the event is dispatched again by the next claim
// (at-least-once), charged one attempt.
func (r *Relay) dispatchLeased(ctx context.Context, row leasedRow) {
	start := time.Now()
	dctx, cancel := context.WithDeadline(ctx, start.Add(r.cfg.LeaseDuration*8/10))
	o := r.dispatchOne(dctx, row.ev)
	cancel()
	err := r.settleLeasedUntil(ctx, row, &o, start.Add(r.cfg.LeaseDuration*9/10))
	switch {
	case errors.Is(err, errLeaseLost):
		r.m.unsettled.Add(ctx, 1)
		r.log.Warn("outbox lease expired before the outcome was recorded; another claim owns the event and it will be dispatched again",
			"event_id", row.ev.ID, "event_type", row.ev.Type, "dispatch", time.Since(start), "lease", r.cfg.LeaseDuration)
		return
	case err != nil:
		if o.kind == outcomePublished {
			r.m.unsettled.Add(ctx, 1)
		}
		// The lease expires and the next claim charges the event an
		// attempt: a dispatched event may be dispatched again.
		r.log.Warn("outbox leased event not recorded; it is claimed again when its lease expires", "event_id", row.ev.ID, "error", err)
		return
	}
	r.count(ctx, []claimedRow{row.claimedRow}, []outcome{o})
}

// Settlement retries: the first wait, and the longest.
const (
	settleRetryBase = 100 * time.Millisecond
	settleRetryMax  = 2 * time.Second
)

// settleLeasedUntil records o, and tries again while the database is
// unavailable (a restart, a dropped connection) until by, 90 % of the
// lease: the relay still knows the outcome, and the fence makes a repeat
// harmless (a settlement that did commit leaves the next nothing to match,
// errLeaseLost). Given up at once, the event would wait out the rest of its
// lease and be dispatched again: a chaos run's slowest orders waited 20 to
// 30 s for exactly that after a PostgreSQL restart. Not tied to ctx: a
// dispatched event is recorded even while Run stops, though a stopping relay
// does not wait between attempts.
func (r *Relay) settleLeasedUntil(ctx context.Context, row leasedRow, o *outcome, by time.Time) error {
	for attempt := 0; ; attempt++ {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(r.cfg.LeaseDuration/5, rollbackTimeout))
		err := r.settleLeased(sctx, row, o)
		cancel()
		if err == nil || errors.Is(err, errLeaseLost) || !pgdb.IsUnavailable(err) {
			return err
		}
		wait := min(settleRetryBase<<min(attempt, 5), settleRetryMax)
		if time.Now().Add(wait).After(by) {
			return err
		}
		r.log.Info("outbox leased event's outcome not recorded yet; trying again", "event_id", row.ev.ID, "error", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// errLeaseLost means the event's lease was taken over by another claim: the
// settlement wrote nothing.
var errLeaseLost = errors.New("lease lost")

// settleLeased records o for row in transactions of its own, fenced on the
// claim's token. A published event's transaction sends its BEGIN, settings
// and qLeasePublish with the Commit's first statements and its COMMIT with
// nothing else the Commit left unsent (the pgdb.Tx's queued statements); the
// fence fails in the server when the lease was lost, so nothing of the
// Commit commits. A Commit that fails turns the outcome into a transient
// failure (o is updated), recorded in a second transaction, which like a
// failure's takes one round trip.
func (r *Relay) settleLeased(ctx context.Context, row leasedRow, o *outcome) error {
	now := r.now()
	if o.kind == outcomePublished {
		err := r.publishLeased(ctx, row, o.commit, now)
		var ce *commitError
		if !errors.As(err, &ce) {
			return err
		}
		if pgdb.IsUnavailable(ce.err) {
			// The database failed the Commit, not its own logic: the whole
			// settlement is tried again (settleLeasedUntil), not charged.
			return ce.err
		}
		*o = outcome{kind: outcomeRetry, err: fmt.Errorf("commit after dispatch: %w", ce.err)}
	}
	var (
		query = r.q.leaseRelease
		args  = []any{row.ev.ID, row.token}
	)
	if o.kind == outcomeRetry || o.kind == outcomeFailed {
		msg := truncate(o.err.Error(), 2000)
		status, next := "FAILED", (*time.Time)(nil)
		switch {
		case o.kind == outcomeFailed:
		case row.ev.Attempts >= r.cfg.MaxAttempts:
			msg = fmt.Sprintf("attempts exhausted (%d): %s", row.ev.Attempts, msg)
		default:
			t := now.Add(r.policy.Delay(row.ev.Attempts))
			status, next = "PENDING", &t
		}
		query, args = r.q.leaseRecord, append(args, status, msg, next)
	}
	// One statement whose row count decides nothing to commit: a lost lease
	// (0 rows) wrote nothing, so it may ride the COMMIT.
	var tag pgconn.CommandTag
	err := r.oneTrip(ctx, func(b *pgx.Batch) {
		b.Queue(query, args...).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	})
	if err == nil && tag.RowsAffected() == 0 {
		return errLeaseLost
	}
	return err
}
