package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// leaseOf reads the lease columns of an undelivered row ("" when none).
func leaseOf(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) string {
	t.Helper()
	var owner *string
	if err := pool.QueryRow(context.Background(), `SELECT lease_owner FROM outbox WHERE event_id = $1`, id).Scan(&owner); err != nil {
		t.Fatalf("lease of %s: %v", id, err)
	}
	if owner == nil {
		return ""
	}
	return *owner
}

// gate blocks dispatchers until it is opened (once, by the test or by its
// cleanup, which must run before the relays' so that Run can return).
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate  { return &gate{ch: make(chan struct{})} }
func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }
func (g *gate) wait() { <-g.ch }

// receive waits for a value from ch, failing the test after 30 s.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// Two relays in slow mode: every event dispatched exactly once, the events
// of an aggregate one at a time and in order.
func TestSlowDispatch_TwoRelays_PerAggregateOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const aggregates, perAgg = 10, 5
	var (
		mu         sync.Mutex
		seen       = map[uuid.UUID]int{}
		lastSeq    = map[string]int{}
		busy       = map[string]bool{}
		violations []string
		total      atomic.Int64
	)
	b.rec.fn = func(ev outbox.Event) (outbox.Commit, error) {
		var seq int
		if _, err := fmt.Sscanf(string(ev.Payload[len(ev.AggregateID)+1:]), "%d", &seq); err != nil {
			return nil, err
		}
		mu.Lock()
		if busy[ev.AggregateID] {
			violations = append(violations, fmt.Sprintf("aggregate %s: two events in flight", ev.AggregateID))
		}
		busy[ev.AggregateID] = true
		seen[ev.ID]++
		if seen[ev.ID] > 1 {
			violations = append(violations, fmt.Sprintf("event %s dispatched %d times", ev.ID, seen[ev.ID]))
		}
		if prev, ok := lastSeq[ev.AggregateID]; (ok && seq != prev+1) || (!ok && seq != 0) {
			violations = append(violations, fmt.Sprintf("aggregate %s: event %d after %d", ev.AggregateID, seq, prev))
		}
		lastSeq[ev.AggregateID] = seq
		mu.Unlock()
		// The aggregate is busy until its outcome is recorded, after the
		// Commit; the next event may be dispatched only after that.
		return func(context.Context, pgx.Tx) error {
			mu.Lock()
			busy[ev.AggregateID] = false
			mu.Unlock()
			total.Add(1)
			return nil
		}, nil
	}
	var evs []outbox.Event
	for n := range perAgg {
		for a := range aggregates {
			evs = append(evs, event(fmt.Sprintf("a%d", a), n))
		}
	}
	appendCommitted(t, b.pool, evs...)
	cfg := outbox.Config{SlowDispatchConcurrency: 3, PollInterval: 20 * time.Millisecond}
	for i := range 2 {
		cfg.RelayID = fmt.Sprintf("relay-%d", i)
		runRelay(t, b.relay(t, b.pool, cfg, outbox.WithClock(time.Now), outbox.WithSlowDispatch(testType)))
	}
	waitfor.Value(t, 30*time.Second, "events published", int64(len(evs)), total.Load)
	waitfor.Value(t, 10*time.Second, "rows published", len(evs), func() int { return countStatus(t, b.pool, "PUBLISHED") })
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%d violations, first: %v", len(violations), violations[:min(5, len(violations))])
	}
}

// A dispatch that outlives its lease: another relay claims the event as a
// suspect (its lease was not alone, so the overrun is not charged) and the
// stale relay, when its dispatch finally returns, records nothing. The
// event is published once, by the relay that holds the lease, after two
// dispatches (at-least-once).
func TestSlowDispatch_StaleRelayCannotSettle_AnotherRedoesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("wo-1", 1)
	appendCommitted(t, b.pool, ev)
	entered := make(chan int, 2)
	release := []*gate{newGate(), newGate()}
	openAll := func() { release[0].open(); release[1].open() }
	var calls atomic.Int64
	b.rec.fn = func(outbox.Event) (outbox.Commit, error) {
		n := int(calls.Add(1)) - 1
		entered <- n
		release[n].wait()
		return nil, nil
	}
	// One worker each: the stale relay has none free to re-claim the event
	// itself once its lease expires.
	cfg := outbox.Config{RelayID: "relay-a", SlowDispatchConcurrency: 1, PollInterval: 20 * time.Millisecond, SweepInterval: 20 * time.Millisecond}
	stopA := runRelay(t, b.relay(t, b.pool, cfg, outbox.WithSlowDispatch(testType)))
	t.Cleanup(openAll)
	if n := receive(t, entered, "relay-a's dispatch"); n != 0 {
		t.Fatalf("first dispatch is call %d", n)
	}
	if owner := leaseOf(t, b.pool, ev.ID); !strings.HasPrefix(owner, "relay-a/") {
		t.Fatalf("lease owner %q, want relay-a's", owner)
	}

	b.clock.Advance(outbox.DefaultLeaseDuration + time.Second) // relay-a's lease expires
	cfg.RelayID = "relay-b"
	runRelay(t, b.relay(t, b.pool, cfg, outbox.WithSlowDispatch(testType)))
	t.Cleanup(openAll)
	if n := receive(t, entered, "relay-b's dispatch of the expired lease"); n != 1 {
		t.Fatalf("second dispatch is call %d", n)
	}
	got := rowOf(t, b.pool, ev.ID)
	if owner := leaseOf(t, b.pool, ev.ID); !strings.HasPrefix(owner, "relay-b/") || got.Attempts != 0 || got.LastError != nil {
		t.Fatalf("after relay-b's claim: lease %q, row %+v (last_error %s); want relay-b's lease, nothing charged", owner, got, deref(got.LastError))
	}

	release[0].open()
	stopA() // returns once relay-a has tried to record its (successful) dispatch
	if got := rowOf(t, b.pool, ev.ID); got.Status != "PENDING" || leaseOf(t, b.pool, ev.ID) == "" || !strings.HasPrefix(leaseOf(t, b.pool, ev.ID), "relay-b/") {
		t.Fatalf("the stale relay recorded its outcome: %+v", got)
	}

	release[1].open()
	waitfor.Value(t, 10*time.Second, "event published by relay-b", "PUBLISHED", func() string { return rowOf(t, b.pool, ev.ID).Status })
	if got := rowOf(t, b.pool, ev.ID); got.Attempts != 1 || calls.Load() != 2 {
		t.Fatalf("published row %+v after %d dispatches; want 1 attempt charged, 2 dispatches", got, calls.Load())
	}
}

// A settlement whose connection dies (a PostgreSQL restart, a dropped
// link), before its COMMIT or under the event's own Commit, is recorded
// again as soon as the database answers, not left to the lease nor charged
// as a failed attempt: the event is published after one dispatch, its lease
// never expiring (the relay's clock stands still).
func TestSlowDispatch_SettlementRetriedWhenItsConnectionDies(t *testing.T) {
	t.Parallel()
	for name, inCommit := range map[string]bool{"before its COMMIT": false, "under the event's Commit": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ev := event("wo-1", 1)
			appendCommitted(t, b.pool, ev)
			admin, err := pgx.Connect(context.Background(), b.pool.Config().ConnString())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = admin.Close(context.Background()) }()
			var dispatches, commits atomic.Int64
			b.rec.fn = func(outbox.Event) (outbox.Commit, error) {
				dispatches.Add(1)
				return func(ctx context.Context, tx pgx.Tx) error {
					if commits.Add(1) > 1 {
						return nil
					}
					// The first settlement's backend is terminated, and gone.
					var pid int
					if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
						return err
					}
					if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
						return err
					}
					// Not waitfor.Value: this runs on the relay's goroutine.
					if !waitfor.Until(10*time.Second, func() bool {
						var n int
						return admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n) == nil && n == 0
					}) {
						return errors.New("the terminated backend is still there after 10 s")
					}
					if inCommit {
						_, err := tx.Exec(ctx, `SELECT 1`)
						return err
					}
					return nil
				}, nil
			}
			runRelay(t, b.relay(t, b.pool, outbox.Config{PollInterval: 20 * time.Millisecond}, outbox.WithSlowDispatch(testType)))
			waitfor.Value(t, 10*time.Second, "event published", "PUBLISHED", func() string { return rowOf(t, b.pool, ev.ID).Status })
			if dispatches.Load() != 1 || commits.Load() != 2 {
				t.Fatalf("%d dispatches, %d settlement attempts; want 1 dispatch, recorded on the second attempt", dispatches.Load(), commits.Load())
			}
		})
	}
}

// A relay that starts under the id of a process that died (the instance
// restarted) ends the leases that process left at once: their events are
// dispatched again as suspects without waiting out the lease. A lease of
// another relay id is left to run.
func TestSlowDispatch_RestartedRelayEndsItsPredecessorsLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mine, theirs := event("wo-1", 1), event("wo-2", 1)
	appendCommitted(t, b.pool, mine, theirs)
	for id, owner := range map[uuid.UUID]string{mine.ID: "relay-x/7", theirs.ID: "relay-y/3"} {
		if _, err := b.pool.Exec(context.Background(),
			`UPDATE outbox SET lease_owner = $2, lease_until = $3 WHERE event_id = $1`, id, owner, b.clock.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	var dispatched sync.Map
	b.rec.fn = func(ev outbox.Event) (outbox.Commit, error) {
		dispatched.Store(ev.ID, true)
		return nil, nil
	}
	cfg := outbox.Config{RelayID: "relay-x", PollInterval: 20 * time.Millisecond, SweepInterval: 20 * time.Millisecond}
	runRelay(t, b.relay(t, b.pool, cfg, outbox.WithSlowDispatch(testType)))
	waitfor.Value(t, 10*time.Second, "the predecessor's event published", "PUBLISHED", func() string { return rowOf(t, b.pool, mine.ID).Status })
	if got := rowOf(t, b.pool, mine.ID); got.Attempts != 1 {
		t.Fatalf("published %+v; want 1 attempt: the predecessor's lease was not alone, so its death is not charged", got)
	}
	if _, ok := dispatched.Load(theirs.ID); ok || !strings.HasPrefix(leaseOf(t, b.pool, theirs.ID), "relay-y/") {
		t.Fatalf("relay-y's live lease was taken over (lease %q)", leaseOf(t, b.pool, theirs.ID))
	}
}

// A transient failure ends the lease and backs off like the lock claim's:
// PENDING with a retry time within the first backoff window, sent again
// once the clock passes it.
func TestSlowDispatch_TransientFailureBacksOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("wo-1", 1)
	appendCommitted(t, b.pool, ev)
	var calls atomic.Int64
	b.rec.fn = func(outbox.Event) (outbox.Commit, error) {
		if calls.Add(1) == 1 {
			return nil, errors.New("provider said no")
		}
		return nil, nil
	}
	cfg := outbox.Config{BackoffBase: time.Minute, BackoffMax: time.Minute, PollInterval: 20 * time.Millisecond}
	runRelay(t, b.relay(t, b.pool, cfg, outbox.WithSlowDispatch(testType)))
	waitfor.Value(t, 10*time.Second, "first failure recorded", 1, func() int { return rowOf(t, b.pool, ev.ID).Attempts })
	got := rowOf(t, b.pool, ev.ID)
	var next time.Time
	if err := b.pool.QueryRow(context.Background(), `SELECT next_attempt_at FROM outbox WHERE event_id = $1`, ev.ID).Scan(&next); err != nil {
		t.Fatal(err)
	}
	if got.Status != "PENDING" || got.LastError == nil || *got.LastError != "provider said no" || leaseOf(t, b.pool, ev.ID) != "" {
		t.Fatalf("after the failure: %+v, lease %q; want PENDING, the error, no lease", got, leaseOf(t, b.pool, ev.ID))
	}
	if now := b.clock.Now(); next.Before(now) || next.After(now.Add(time.Minute)) {
		t.Fatalf("next attempt %v not within the first backoff window after %v", next, now)
	}
	b.clock.Advance(time.Minute + time.Second)
	waitfor.Value(t, 10*time.Second, "retry published", "PUBLISHED", func() string { return rowOf(t, b.pool, ev.ID).Status })
	if got := rowOf(t, b.pool, ev.ID); got.Attempts != 2 || calls.Load() != 2 {
		t.Fatalf("published %+v after %d calls, want 2 attempts", got, calls.Load())
	}
}

// While a slow dispatch blocks, no session of the relay has a transaction
// open (the lease was committed before the dispatch), and a type in lock
// mode on the same relay keeps flowing.
func TestSlowDispatch_NoTransactionOpenDuringTheDispatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const fastType = "test.v1.Fast"
	slow, fast := event("wo-1", 1), event("wo-2", 1)
	fast.Type = fastType
	appendCommitted(t, b.pool, slow, fast)
	entered, release := make(chan struct{}, 1), newGate()
	b.rec.fn = func(outbox.Event) (outbox.Commit, error) {
		entered <- struct{}{}
		release.wait()
		return nil, nil
	}
	var fastSent atomic.Int64
	r, err := outbox.NewRelay(b.pool, map[string]outbox.Dispatcher{
		testType: b.rec,
		fastType: outbox.DispatcherFunc(func(context.Context, outbox.Event) (outbox.Commit, error) { fastSent.Add(1); return nil, nil }),
	}, outbox.Config{PollInterval: 20 * time.Millisecond}, discard(), nil, outbox.WithClock(b.clock.Now), outbox.WithSlowDispatch(testType))
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	t.Cleanup(release.open)
	receive(t, entered, "the slow dispatch")
	var dispatching time.Time
	if err := b.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&dispatching); err != nil {
		t.Fatal(err)
	}
	waitfor.Value(t, 10*time.Second, "fast event published", "PUBLISHED", func() string { return rowOf(t, b.pool, fast.ID).Status })
	if owner := leaseOf(t, b.pool, slow.ID); owner == "" {
		t.Fatal("slow event in flight without a lease")
	}
	// While the slow dispatch stays blocked, no transaction begun before it
	// may stay open: the lock claim would hold one across it until release.
	// The lock loop's own short claims (begun later, or ending at once) are
	// not held across anything, so the condition waits them out.
	var open []string
	waitfor.Condition(t, 5*time.Second, "no transaction open across the slow dispatch", func() bool {
		open = open[:0]
		rows, err := b.pool.Query(context.Background(), `
			SELECT application_name || ': ' || coalesce(query, '') FROM pg_stat_activity
			WHERE datname = current_database() AND xact_start <= $1 AND pid <> pg_backend_pid()`, dispatching)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			open = append(open, s)
		}
		if len(open) > 0 {
			t.Logf("open since before the dispatch: %v", open)
		}
		return len(open) == 0
	})
	release.open()
	waitfor.Value(t, 10*time.Second, "slow event published", "PUBLISHED", func() string { return rowOf(t, b.pool, slow.ID).Status })
	if fastSent.Load() != 1 {
		t.Fatalf("fast event sent %d times", fastSent.Load())
	}
}
