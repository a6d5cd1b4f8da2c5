package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const testType = "test.v1.Happened"

// clock is a settable clock shared by a test and its relays.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Now().UTC()} }

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// recorder is a dispatcher that records every delivery in order.
type recorder struct {
	mu    sync.Mutex
	got   []outbox.Event
	count atomic.Int64
	fn    func(ev outbox.Event) (outbox.Commit, error) // optional behaviour
}

func (r *recorder) Dispatch(_ context.Context, ev outbox.Event) (outbox.Commit, error) {
	if r.fn != nil {
		c, err := r.fn(ev)
		if err != nil {
			return nil, err
		}
		r.record(ev)
		return c, nil
	}
	r.record(ev)
	return nil, nil
}

func (r *recorder) record(ev outbox.Event) {
	r.mu.Lock()
	r.got = append(r.got, ev)
	r.mu.Unlock()
	r.count.Add(1)
}

func (r *recorder) events() []outbox.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outbox.Event(nil), r.got...)
}

type bundle struct {
	pool  *pgxpool.Pool
	clock *clock
	rec   *recorder
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{pool: pgtest.NewPool(t, outbox.Migrations("")), clock: newClock(), rec: &recorder{}}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// relay returns a relay on b's clock, unless opts set another.
func (b *bundle) relay(t *testing.T, pool *pgxpool.Pool, cfg outbox.Config, opts ...outbox.Option) *outbox.Relay {
	t.Helper()
	opts = append([]outbox.Option{outbox.WithClock(b.clock.Now)}, opts...)
	r, err := outbox.NewRelay(pool, map[string]outbox.Dispatcher{testType: b.rec}, cfg, discard(), nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func event(agg string, n int) outbox.Event {
	return outbox.Event{
		ID: uuid.Must(uuid.NewV7()), AggregateType: "thing", AggregateID: agg, Type: testType,
		SchemaVersion: 1, Payload: []byte(fmt.Sprintf("%s/%d", agg, n)), OccurredAt: time.Now(),
		Headers: map[string]string{outbox.HeaderCorrelationID: "corr-" + agg},
	}
}

func appendCommitted(t *testing.T, pool *pgxpool.Pool, evs ...outbox.Event) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Append(ctx, tx, evs...) })
	if err != nil {
		t.Fatal(err)
	}
}

type row struct {
	Status    string
	Attempts  int
	LastError *string
}

func rowOf(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) row {
	t.Helper()
	var r row
	err := pool.QueryRow(context.Background(),
		`SELECT status, attempts, last_error FROM outbox_events WHERE event_id = $1`, id).Scan(&r.Status, &r.Attempts, &r.LastError)
	if err != nil {
		t.Fatalf("row %s: %v", id, err)
	}
	return r
}

func countStatus(t *testing.T, pool *pgxpool.Pool, status string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_events WHERE status = $1`, status).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func processBatch(t *testing.T, r *outbox.Relay) {
	t.Helper()
	if _, err := r.ProcessBatch(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func runRelay(t *testing.T, r *outbox.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run returned %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestNewEventCarriesTypePayloadAndTraceContext(t *testing.T) {
	t.Parallel()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled,
	}))
	ev, err := outbox.NewEvent(ctx, "work_order", "wo-1", wrapperspb.String("x"))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Type != "google.protobuf.StringValue" || ev.SchemaVersion != 1 || ev.ID.Version() != 7 || len(ev.Payload) == 0 {
		t.Fatalf("unexpected event %+v", ev)
	}
	if got, want := ev.Headers[outbox.HeaderTraceparent], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; got != want {
		t.Fatalf("traceparent %q, want %q", got, want)
	}
}

func TestAppendRejectsIncompleteEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	bad := event("a", 1)
	bad.AggregateID = ""
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Append(ctx, tx, bad) })
	if err == nil {
		t.Fatal("event without aggregate id accepted")
	}
}

// F1: the process dies after the business transaction committed and before
// anything was published; a relay started afterwards publishes the event.
func TestF1_CrashAfterCommitBeforePublish_PublishesAfterRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("wo-1", 1)
	appendCommitted(t, b.pool, ev) // ...and the "process" dies: no relay ran
	if got := rowOf(t, b.pool, ev.ID); got.Status != "PENDING" {
		t.Fatalf("status %s before any relay", got.Status)
	}
	stop := runRelay(t, b.relay(t, b.pool, outbox.Config{}))
	waitfor.Value(t, 5*time.Second, "event published after restart", "PUBLISHED", func() string {
		return rowOf(t, b.pool, ev.ID).Status
	})
	stop()
	got := b.rec.events()
	if len(got) != 1 || got[0].ID != ev.ID || string(got[0].Payload) != "wo-1/1" ||
		got[0].Headers[outbox.HeaderCorrelationID] != "corr-wo-1" || got[0].Attempts != 1 {
		t.Fatalf("delivered %+v", got)
	}
}

// doomedPool returns a pool, and the relay id to use with it, whose sessions
// the test can kill from the database side, as the death of the relay's
// process would end them. (A batch in flight shows the relay id as its
// application_name.) kill returns once the sessions have exited: the server
// releases a session's row locks as its process exits, a moment after the
// client has seen the connection drop.
func doomedPool(t *testing.T, b *bundle) (*pgxpool.Pool, string, func()) {
	t.Helper()
	cfg := b.pool.Config().Copy()
	name := "doomed-" + uuid.NewString()[:8]
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	kill := func() {
		var n int
		err := b.pool.QueryRow(context.Background(), `
			SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))
			FROM pg_stat_activity WHERE application_name = $1`, name).Scan(&n)
		if err != nil || n == 0 {
			t.Errorf("killed %d sessions (%v)", n, err)
		}
	}
	return pool, name, kill
}

// F2: a relay publishes, then dies before recording it. Its transaction dies
// with it, so the row is claimable again at once, and the next relay
// delivers the same event again, with the same event id (the consumer
// deduplicates on it).
func TestF2_PublishThenCrashBeforeMark_RedeliversSameEventID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("wo-1", 1)
	appendCommitted(t, b.pool, ev)

	doomed, relayID, kill := doomedPool(t, b)
	b.rec.fn = func(outbox.Event) (outbox.Commit, error) {
		kill() // the "crash": the relay's session ends after the publish, before the mark
		return nil, nil
	}
	first := b.relay(t, doomed, outbox.Config{RelayID: relayID})
	if _, err := first.ProcessBatch(context.Background()); err == nil {
		t.Fatal("mark succeeded in a terminated session")
	}
	if got := rowOf(t, b.pool, ev.ID); got.Status != "PENDING" || b.rec.count.Load() != 1 {
		t.Fatalf("after crash: %+v, deliveries %d", got, b.rec.count.Load())
	}
	b.rec.fn = nil
	processBatch(t, b.relay(t, b.pool, outbox.Config{}))
	got := b.rec.events()
	if len(got) != 2 || got[0].ID != ev.ID || got[1].ID != ev.ID {
		t.Fatalf("deliveries %+v", got)
	}
	// The crashed attempt left no trace: attempts count recorded failures.
	if r := rowOf(t, b.pool, ev.ID); r.Status != "PUBLISHED" || r.Attempts != 1 {
		t.Fatalf("row %+v", r)
	}
}

// F3: a business transaction that rolls back leaves no event behind.
func TestF3_RollbackLeavesNoEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Append(ctx, tx, event("wo-1", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after rollback: %d (%v)", n, err)
	}
	processBatch(t, b.relay(t, b.pool, outbox.Config{}))
	if b.rec.count.Load() != 0 {
		t.Fatal("a rolled-back event was dispatched")
	}
}

// A relay killed in the middle of a batch: nothing of the batch was
// recorded, and another relay claims every row of it at once (no lease to
// wait for: the locks died with the session). The rows dispatched before the
// kill are dispatched a second time.
func TestRelayKilledMidBatch_RowsReclaimedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var evs []outbox.Event
	for i := range 10 {
		evs = append(evs, event(fmt.Sprintf("agg-%d", i), 1))
	}
	appendCommitted(t, b.pool, evs...)

	doomed, relayID, kill := doomedPool(t, b)
	var calls atomic.Int64
	b.rec.fn = func(outbox.Event) (outbox.Commit, error) {
		if calls.Add(1) == 4 {
			kill() // killed after three deliveries
			return nil, errors.New("killed")
		}
		return nil, nil
	}
	cfg := outbox.Config{DispatchConcurrency: 1}
	if _, err := b.relay(t, doomed, outbox.Config{DispatchConcurrency: 1, RelayID: relayID}).ProcessBatch(context.Background()); err == nil {
		t.Fatal("relay survived its own death")
	}
	if n := countStatus(t, b.pool, "PENDING"); n != 10 {
		t.Fatalf("%d rows PENDING after the kill, want 10", n)
	}
	b.rec.fn = nil
	processBatch(t, b.relay(t, b.pool, cfg))
	if n := countStatus(t, b.pool, "PUBLISHED"); n != 10 {
		t.Fatalf("%d rows published by the survivor, want 10", n)
	}
	// The dying relay delivered 9 (all but the 4th) before its mark failed;
	// the survivor delivers all 10 again.
	if got := b.rec.count.Load(); got != 19 {
		t.Fatalf("%d deliveries, want 9 + 10", got)
	}
}

// A claim holds its rows while the relay dispatches: another relay does not
// take them. A relay that hangs without closing its connection (a frozen
// process, a partition) loses them when the server's idle-in-transaction
// timeout, set to the lease, ends its session.
func TestClaimHoldsRowsUntilTheLeaseThenTheServerReleasesThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("wo-1", 1)
	appendCommitted(t, b.pool, ev)

	claimed, release := make(chan struct{}), make(chan struct{})
	hung := outbox.DispatcherFunc(func(context.Context, outbox.Event) (outbox.Commit, error) {
		close(claimed)
		<-release // ignores its context, like a process that stopped running
		return nil, nil
	})
	stuck, err := outbox.NewRelay(b.pool, map[string]outbox.Dispatcher{testType: hung},
		outbox.Config{LeaseDuration: time.Second, RelayID: "stuck-relay"}, discard(), nil, outbox.WithClock(b.clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	stuckErr := make(chan error, 1)
	go func() { _, err := stuck.ProcessBatch(context.Background()); stuckErr <- err }()
	<-claimed
	// The batch in flight is visible to an operator (runbook: batches in flight).
	var inFlight int
	if err := b.pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_stat_activity
		WHERE application_name = 'stuck-relay' AND state LIKE 'idle in transaction%'`).Scan(&inFlight); err != nil || inFlight != 1 {
		t.Fatalf("%d sessions show the relay's batch in flight (%v), want 1", inFlight, err)
	}

	other := b.relay(t, b.pool, outbox.Config{})
	processBatch(t, other)
	if b.rec.count.Load() != 0 {
		t.Fatal("a second relay dispatched a row the first one holds")
	}
	waitfor.Condition(t, 10*time.Second, "row released by the server and published by the other relay", func() bool {
		processBatch(t, other)
		return rowOf(t, b.pool, ev.ID).Status == "PUBLISHED"
	})
	close(release)
	if err := <-stuckErr; err == nil {
		t.Fatal("the hung relay recorded its batch after losing its session")
	}
	if got := rowOf(t, b.pool, ev.ID); got.Status != "PUBLISHED" || got.Attempts != 1 || b.rec.count.Load() != 1 {
		t.Fatalf("row %+v after both relays, other relay dispatched %d", got, b.rec.count.Load())
	}
}

// The commit-order trap (watermill #311): a row with a lower id that commits
// after the cursor passed a higher id must still be dispatched: through
// NOTIFY (Append announces its lowest id), sent in the transaction or after
// its commit (a pgdb.Tx); when the notification was lost because nobody
// listened, at the (re)connect of the listener; and, with no listener,
// through the periodic sweep.
func TestLateCommitWithLowerID_IsDispatched(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"notify", "notify-after-commit", "listen", "sweep"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			late, early := event("late", 1), event("early", 1)
			var (
				slow pgx.Tx
				err  error
			)
			if via == "notify-after-commit" {
				slow, err = pgdb.Begin(ctx, b.pool, nil)
			} else {
				slow, err = b.pool.Begin(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = slow.Rollback(ctx) }()
			if err := outbox.Append(ctx, slow, late); err != nil { // takes the lower id
				t.Fatal(err)
			}
			appendCommitted(t, b.pool, early) // higher id, committed first
			var lateID, earlyID int64
			if err := slow.QueryRow(ctx, `SELECT id FROM outbox WHERE event_id = $1`, late.ID).Scan(&lateID); err != nil {
				t.Fatal(err)
			}
			if err := b.pool.QueryRow(ctx, `SELECT id FROM outbox WHERE event_id = $1`, early.ID).Scan(&earlyID); err != nil {
				t.Fatal(err)
			}
			if lateID >= earlyID {
				t.Fatalf("setup: late id %d not below early id %d", lateID, earlyID)
			}
			// The clock never advances in this test unless we say so: no sweep
			// happens after the first claim.
			r := b.relay(t, b.pool, outbox.Config{PollInterval: time.Hour, SweepInterval: time.Hour})
			switch via {
			case "notify", "notify-after-commit":
				runRelay(t, r)
				waitListening(t, b.pool)
				waitfor.Value(t, 5*time.Second, "early event published", "PUBLISHED", func() string { return rowOf(t, b.pool, early.ID).Status })
				if err := slow.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				waitfor.Value(t, 5*time.Second, "late event published", "PUBLISHED", func() string { return rowOf(t, b.pool, late.ID).Status })
				return
			case "listen":
				processBatch(t, r) // claims "early"; the cursor passes it
				// Nobody listens yet: the commit's NOTIFY is lost.
				if err := slow.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				runRelay(t, r) // no sweep is due: only the rewind at LISTEN finds the row
				waitfor.Value(t, 5*time.Second, "late event published", "PUBLISHED", func() string { return rowOf(t, b.pool, late.ID).Status })
				return
			}
			processBatch(t, r) // claims "early"; the cursor passes it
			if err := slow.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			processBatch(t, r)
			if got := rowOf(t, b.pool, late.ID).Status; got != "PENDING" {
				t.Fatalf("keyset claim found the late row (%s): the test no longer exercises the trap", got)
			}
			b.clock.Advance(time.Hour)
			processBatch(t, r)
			if got := rowOf(t, b.pool, late.ID).Status; got != "PUBLISHED" {
				t.Fatalf("late row %s after the sweep", got)
			}
		})
	}
}

func TestTransientFailure_RetriedWithBackoffThenPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("wo-1", 1)
	appendCommitted(t, b.pool, ev)
	var fails atomic.Int64
	b.rec.fn = func(outbox.Event) (outbox.Commit, error) {
		if fails.Add(1) <= 2 {
			return nil, errors.New("provider unavailable")
		}
		return nil, nil
	}
	cfg := outbox.Config{BackoffBase: time.Minute, BackoffMax: 10 * time.Minute, SweepInterval: time.Second}
	r := b.relay(t, b.pool, cfg)
	processBatch(t, r)
	got := rowOf(t, b.pool, ev.ID)
	if got.Status != "PENDING" || got.Attempts != 1 || got.LastError == nil || *got.LastError != "provider unavailable" {
		t.Fatalf("after first failure: %+v", got)
	}
	var next time.Time
	if err := b.pool.QueryRow(context.Background(), `SELECT next_attempt_at FROM outbox WHERE event_id = $1`, ev.ID).Scan(&next); err != nil {
		t.Fatal(err)
	}
	if next.Before(b.clock.Now()) || next.After(b.clock.Now().Add(time.Minute+time.Second)) {
		t.Fatalf("next attempt %v not within the first backoff window after %v", next, b.clock.Now())
	}
	for range 2 { // each retry waits at most the (capped) backoff ceiling
		b.clock.Advance(10*time.Minute + time.Second)
		processBatch(t, r)
	}
	got = rowOf(t, b.pool, ev.ID)
	if got.Status != "PUBLISHED" || got.Attempts != 3 || got.LastError == nil || *got.LastError != "provider unavailable" {
		t.Fatalf("after recovery (the last error is kept for diagnosis): %+v", got)
	}
}

func TestTransientFailure_BoundedByMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("wo-1", 1)
	appendCommitted(t, b.pool, ev)
	b.rec.fn = func(outbox.Event) (outbox.Commit, error) { return nil, errors.New("timeout") }
	r := b.relay(t, b.pool, outbox.Config{MaxAttempts: 3, BackoffBase: time.Second, BackoffMax: time.Second})
	for range 5 {
		processBatch(t, r)
		b.clock.Advance(2 * time.Second)
	}
	got := rowOf(t, b.pool, ev.ID)
	if got.Status != "FAILED" || got.Attempts != 3 || got.LastError == nil {
		t.Fatalf("row %+v", got)
	}
}

// A permanent error moves the event to FAILED with its reason, and the
// FAILED event keeps blocking later events of its aggregate (per-aggregate
// order) while other aggregates proceed.
func TestPermanentFailure_GoesToFailedAndBlocksItsAggregate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	poison, after, other := event("wo-1", 1), event("wo-1", 2), event("wo-2", 1)
	appendCommitted(t, b.pool, poison)
	appendCommitted(t, b.pool, after)
	appendCommitted(t, b.pool, other)
	b.rec.fn = func(ev outbox.Event) (outbox.Commit, error) {
		if ev.ID == poison.ID {
			return nil, retry.Permanent(errors.New("schema invalid"))
		}
		return nil, nil
	}
	r := b.relay(t, b.pool, outbox.Config{})
	processBatch(t, r)
	b.clock.Advance(time.Hour)
	processBatch(t, r) // a sweep: still nothing for wo-1
	if got := rowOf(t, b.pool, poison.ID); got.Status != "FAILED" || got.Attempts != 1 ||
		got.LastError == nil || *got.LastError != "permanent: schema invalid" {
		t.Fatalf("poison row %+v", got)
	}
	if got := rowOf(t, b.pool, after.ID); got.Status != "PENDING" || got.Attempts != 0 {
		t.Fatalf("event behind a FAILED one: %+v", got)
	}
	if got := rowOf(t, b.pool, other.ID); got.Status != "PUBLISHED" {
		t.Fatalf("other aggregate: %+v", got)
	}
	s, err := r.Stats(context.Background())
	if err != nil || s.Failed != 1 || s.Pending != 1 {
		t.Fatalf("stats %+v (%v)", s, err)
	}
}

func TestUnknownEventType_GoesToFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("wo-1", 1)
	ev.Type = "test.v1.NobodyHandlesThis"
	appendCommitted(t, b.pool, ev)
	processBatch(t, b.relay(t, b.pool, outbox.Config{}))
	got := rowOf(t, b.pool, ev.ID)
	if got.Status != "FAILED" || got.LastError == nil || *got.LastError != `no dispatcher for event type "test.v1.NobodyHandlesThis"` {
		t.Fatalf("row %+v", got)
	}
	if b.rec.count.Load() != 0 {
		t.Fatal("dispatched to the wrong dispatcher")
	}
}

// The Commit of a dispatch runs in the transaction that marks its row; when
// one Commit fails, the others are still marked (one by one) and the failing
// row is retried.
func TestCommit_RunsWithTheMark_AndOneBadCommitDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE handed_off (event_id uuid PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	good, bad := event("wo-1", 1), event("wo-2", 1)
	appendCommitted(t, b.pool, good, bad)
	b.rec.fn = func(ev outbox.Event) (outbox.Commit, error) {
		return func(ctx context.Context, tx pgx.Tx) error {
			if ev.ID == bad.ID {
				return errors.New("order vanished")
			}
			_, err := tx.Exec(ctx, `INSERT INTO handed_off VALUES ($1)`, ev.ID)
			return err
		}, nil
	}
	processBatch(t, b.relay(t, b.pool, outbox.Config{}))
	if got := rowOf(t, b.pool, good.ID); got.Status != "PUBLISHED" {
		t.Fatalf("good row %+v", got)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM handed_off WHERE event_id = $1`, good.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("commit effect rows %d (%v)", n, err)
	}
	got := rowOf(t, b.pool, bad.ID)
	if got.Status != "PENDING" || got.LastError == nil {
		t.Fatalf("bad row %+v", got)
	}
}

func TestCleanup_DeletesOnlyOldPublishedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	oldPub, newPub, oldPending, oldFailed := event("a", 1), event("b", 1), event("c", 1), event("d", 1)
	appendCommitted(t, b.pool, oldPub, newPub)
	processBatch(t, b.relay(t, b.pool, outbox.Config{}))
	appendCommitted(t, b.pool, oldPending, oldFailed)
	_, err := b.pool.Exec(ctx, `UPDATE outbox_published SET published_at = now() - interval '25 hours' WHERE event_id = $1`, oldPub.ID)
	if err == nil {
		_, err = b.pool.Exec(ctx, `UPDATE outbox_published SET published_at = now() - interval '23 hours' WHERE event_id = $1`, newPub.ID)
	}
	if err == nil {
		_, err = b.pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '48 hours' WHERE event_id = ANY($1)`, []uuid.UUID{oldPending.ID, oldFailed.ID})
	}
	if err == nil {
		_, err = b.pool.Exec(ctx, `UPDATE outbox SET status = 'FAILED' WHERE event_id = $1`, oldFailed.ID)
	}
	if err != nil {
		t.Fatal(err)
	}
	r := b.relay(t, b.pool, outbox.Config{Retention: 24 * time.Hour, CleanupBatch: 1})
	n, err := r.Cleanup(ctx)
	if err != nil || n != 1 {
		t.Fatalf("deleted %d (%v), want 1", n, err)
	}
	var left []uuid.UUID
	rows, _ := b.pool.Query(ctx, `SELECT event_id FROM outbox_events ORDER BY id`)
	left, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(left) != 3 || left[0] != newPub.ID || left[1] != oldPending.ID || left[2] != oldFailed.ID {
		t.Fatalf("left %v (%v)", left, err)
	}
}

// NOTIFY wakes an idle relay: the poll interval and the sweep are an hour,
// so only the notification can explain a prompt dispatch.
func TestNotify_WakesIdleRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runRelay(t, b.relay(t, b.pool, outbox.Config{PollInterval: time.Hour, SweepInterval: time.Hour}))
	waitListening(t, b.pool)
	for i := range 3 {
		ev := event(fmt.Sprintf("wo-%d", i), 1)
		appendCommitted(t, b.pool, ev)
		waitfor.Value(t, 5*time.Second, "event dispatched after NOTIFY", "PUBLISHED", func() string { return rowOf(t, b.pool, ev.ID).Status })
	}
}

// Several relays on one table, repeated: every event is dispatched exactly
// once (no lease expires here) and the events of each aggregate in order.
func TestConcurrentRelays_NoDoubleDispatch_PerAggregateOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		rounds     = 20
		relays     = 3
		aggregates = 8
		perAgg     = 6
	)
	var mu sync.Mutex
	seen := map[uuid.UUID]int{}
	lastSeq := map[string]int{}
	var violations []string
	var total atomic.Int64
	b.rec.fn = func(ev outbox.Event) (outbox.Commit, error) {
		var seq int
		if _, err := fmt.Sscanf(string(ev.Payload[len(ev.AggregateID)+1:]), "%d", &seq); err != nil {
			return nil, retry.Permanent(err)
		}
		mu.Lock()
		seen[ev.ID]++
		if seen[ev.ID] > 1 {
			violations = append(violations, fmt.Sprintf("event %s dispatched %d times", ev.ID, seen[ev.ID]))
		}
		if prev, ok := lastSeq[ev.AggregateID]; (ok && seq != prev+1) || (!ok && seq != 0) {
			violations = append(violations, fmt.Sprintf("aggregate %s: event %d after %d", ev.AggregateID, seq, prev))
		}
		lastSeq[ev.AggregateID] = seq
		mu.Unlock()
		total.Add(1)
		return nil, nil
	}
	ctx := context.Background()
	for round := range rounds {
		var stops []func()
		for range relays {
			stops = append(stops, runRelay(t, b.relay(t, b.pool, outbox.Config{
				BatchSize: 7, PollInterval: 20 * time.Millisecond, SweepInterval: 10 * time.Millisecond,
			}, outbox.WithClock(time.Now))))
		}
		// Producers append concurrently; each aggregate's events commit in
		// sequence, like writes serialised by the aggregate's row lock.
		var wg sync.WaitGroup
		for a := range aggregates {
			agg := fmt.Sprintf("r%d-a%d", round, a)
			wg.Go(func() {
				for n := range perAgg {
					ev := event(agg, n)
					if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Append(ctx, tx, ev) }); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		want := int64((round + 1) * aggregates * perAgg)
		// On timeout the rows still undispatched are logged before failing.
		// 30 s: a loaded CI machine.
		if !waitfor.Until(30*time.Second, func() bool { return total.Load() == want }) {
			rows, _ := b.pool.Query(ctx, `SELECT id, aggregate_id, status, attempts, last_error, next_attempt_at FROM outbox ORDER BY id`)
			for rows.Next() {
				vals, _ := rows.Values()
				t.Log(vals...)
			}
			rows.Close()
			t.Fatalf("round %d: %d dispatched, want %d", round, total.Load(), want)
		}
		for _, stop := range stops {
			stop()
		}
		if n := countStatus(t, b.pool, "PUBLISHED"); int64(n) != want {
			t.Fatalf("round %d: %d published, want %d", round, n, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%d violations, first: %v", len(violations), violations[:min(5, len(violations))])
	}
	assertJournalEmpty(t, b)
}

func TestRun_StopsCleanlyOnCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, b.pool, outbox.Config{})
	stop := runRelay(t, r)
	appendCommitted(t, b.pool, event("wo-1", 1))
	waitfor.Value(t, 5*time.Second, "dispatched", int64(1), b.rec.count.Load)
	stop() // fails the test if Run returns an error or does not return
}

func TestNewRelay_RefusesMissingDependenciesAndBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := map[string]outbox.Dispatcher{testType: b.rec}
	cases := map[string]func() error{
		"nil pool":    func() error { _, err := outbox.NewRelay(nil, d, outbox.Config{}, discard(), nil); return err },
		"nil logger":  func() error { _, err := outbox.NewRelay(b.pool, d, outbox.Config{}, nil, nil); return err },
		"no dispatch": func() error { _, err := outbox.NewRelay(b.pool, nil, outbox.Config{}, discard(), nil); return err },
		"bad config": func() error {
			_, err := outbox.NewRelay(b.pool, d, outbox.Config{BatchSize: -1}, discard(), nil)
			return err
		},
	}
	for name, f := range cases {
		if f() == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

// waitListening waits until a relay's LISTEN is in place: a notification
// sent before that is lost, by design of NOTIFY.
func waitListening(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	waitListeningOn(t, pool, "public.outbox")
}

// waitListeningOn waits until exactly one session listens on channel.
func waitListeningOn(t *testing.T, pool *pgxpool.Pool, channel string) {
	t.Helper()
	waitfor.Condition(t, 10*time.Second, "relay listening on "+channel, func() bool {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN ' || quote_ident($1)`, channel).Scan(&n)
		return err == nil && n == 1
	})
}
