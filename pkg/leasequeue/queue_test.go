package leasequeue_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// clock is a settable clock shared by every queue of a test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

const lease = 30 * time.Second

// testBundle is one test's queue, its database and its observability.
type testBundle struct {
	pool   *pgxpool.Pool
	clock  *clock
	reader *sdkmetric.ManualReader
	meter  *sdkmetric.MeterProvider
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.NewPool(t, leasequeue.Migrations(""))
	// effects records every committed job effect, without a unique key: a
	// second effect for one job would show up as a second row.
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (job_id bigint NOT NULL, epoch bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	return &testBundle{pool: pool, clock: newClock(), reader: reader,
		meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}
}

func (b *testBundle) queue(t *testing.T) *leasequeue.Queue {
	t.Helper()
	q, err := leasequeue.New(b.pool, leasequeue.Config{
		Name:          "test",
		LeaseDuration: lease,
		Backoff:       retry.Backoff{Base: time.Second, Max: time.Minute},
	}, slog.New(slog.NewJSONHandler(io.Discard, nil)), b.meter.Meter("test"), leasequeue.WithClock(b.clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func (b *testBundle) enqueue(t *testing.T, q *leasequeue.Queue, n, maxAttempts int) {
	t.Helper()
	jobs := make([]leasequeue.NewJob, n)
	for i := range jobs {
		jobs[i] = leasequeue.NewJob{Payload: []byte("x"), MaxAttempts: maxAttempts}
	}
	if got, err := q.Enqueue(context.Background(), b.pool, jobs...); err != nil || got != n {
		t.Fatalf("enqueue: %d, %v", got, err)
	}
}

// run starts w; the returned stop cancels it and waits for a clean exit.
func run(t *testing.T, w *leasequeue.Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Run did not return within 10s of cancellation")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func fastWorker(cfg leasequeue.WorkerConfig) leasequeue.WorkerConfig {
	cfg.PollInterval = 5 * time.Millisecond
	cfg.RescueInterval = 5 * time.Millisecond
	cfg.FullScanInterval = 5 * time.Millisecond
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = lease - time.Second // real time: effectively never in a test
	}
	return cfg
}

// recordEffect is a job's transactional effect.
func recordEffect(job leasequeue.Job) leasequeue.Complete {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (job_id, epoch) VALUES ($1, $2)`, job.ID, job.Epoch)
		return err
	}
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *testBundle) counter(t *testing.T, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range sum.DataPoints {
					total += dp.Value
				}
			}
		}
	}
	return total
}

func TestEnqueueSkipsDuplicateUniqueKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	n, err := q.Enqueue(ctx, b.pool, leasequeue.NewJob{UniqueKey: "order-1"}, leasequeue.NewJob{UniqueKey: "order-1"})
	if err != nil || n != 1 {
		t.Fatalf("first enqueue: %d, %v; want 1", n, err)
	}
	if n, err := q.Enqueue(ctx, b.pool, leasequeue.NewJob{UniqueKey: "order-1"}); err != nil || n != 0 {
		t.Fatalf("second enqueue: %d, %v; want 0", n, err)
	}
}

// F13: a worker whose lease expired and was taken over tries to complete:
// fenced off, nothing of it commits, and it is counted.
func TestF13_StaleLeaseCompletionIsFencedOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	b.enqueue(t, q, 1, 5)

	a, err := q.Claim(ctx, "worker-a", 10, 0)
	if err != nil || len(a) != 1 || a[0].Epoch != 1 {
		t.Fatalf("A claim: %+v, %v", a, err)
	}
	if none, _ := q.ClaimExpired(ctx, "worker-b", 10); len(none) != 0 {
		t.Fatalf("B claimed a live lease: %+v", none)
	}
	b.clock.Advance(lease + time.Millisecond)
	bj, err := q.ClaimExpired(ctx, "worker-b", 10)
	if err != nil || len(bj) != 1 || bj[0].Epoch != 2 {
		t.Fatalf("B rescue: %+v, %v", bj, err)
	}

	err = q.Complete(ctx, a[0], recordEffect(a[0]))
	if !errors.Is(err, leasequeue.ErrLeaseLost) {
		t.Fatalf("A complete: %v, want ErrLeaseLost", err)
	}
	if err := q.Fail(ctx, a[0], errors.New("late failure")); !errors.Is(err, leasequeue.ErrLeaseLost) {
		t.Fatalf("A fail: %v, want ErrLeaseLost", err)
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 0 {
		t.Fatalf("A's effects committed: %d rows", n)
	}
	if err := q.Complete(ctx, bj[0], recordEffect(bj[0])); err != nil {
		t.Fatalf("B complete: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE epoch = 2`); n != 1 {
		t.Fatalf("effects of B: %d, want 1", n)
	}
	if got := b.counter(t, "leasequeue.lease.fenced"); got != 2 {
		t.Fatalf("fenced counter = %d, want 2 (complete + fail of A)", got)
	}
	// A late heartbeat of A does not resurrect its lease either.
	lost, err := q.Heartbeat(ctx, a)
	if err != nil || len(lost) != 1 {
		t.Fatalf("A heartbeat: lost=%v, %v", lost, err)
	}
}

// F13 through running Workers: A's handler is held until B has finished the
// job, then A's completion is fenced off.
func TestF13_WorkerWithLostLeaseCommitsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	b.enqueue(t, q, 1, 5)

	claimedByA, releaseA := make(chan struct{}), make(chan struct{})
	wa, err := leasequeue.NewWorker(q, func(ctx context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		close(claimedByA)
		<-releaseA
		return recordEffect(job), nil
	}, fastWorker(leasequeue.WorkerConfig{Owner: "a", Workers: 1}))
	if err != nil {
		t.Fatal(err)
	}
	stopA := run(t, wa)
	<-claimedByA
	b.clock.Advance(lease + time.Millisecond)

	wb, err := leasequeue.NewWorker(q, func(_ context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		return recordEffect(job), nil
	}, fastWorker(leasequeue.WorkerConfig{Owner: "b", Workers: 1}))
	if err != nil {
		t.Fatal(err)
	}
	stopB := run(t, wb)
	waitfor.Value(t, 5*time.Second, "B completes the job", 1, func() int {
		return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done' AND epoch = 2`)
	})
	close(releaseA)
	waitfor.Value(t, 5*time.Second, "A's completion is fenced off", int64(1), func() int64 {
		return b.counter(t, "leasequeue.lease.fenced")
	})
	stopA()
	stopB()
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("effects: %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE epoch = 1`); n != 0 {
		t.Fatalf("A's effect committed")
	}
}

// The heartbeat keeps a long job's lease: the clock moves well past the
// original lease, yet no other worker can claim the job.
func TestHeartbeatKeepsLongJobLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	b.enqueue(t, q, 1, 5)

	started, finish := make(chan struct{}), make(chan struct{})
	w, err := leasequeue.NewWorker(q, func(_ context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		close(started)
		<-finish
		return recordEffect(job), nil
	}, fastWorker(leasequeue.WorkerConfig{Owner: "a", Workers: 1, HeartbeatInterval: 5 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, w)
	<-started
	for range 4 { // 4 × 0.6 lease = 2.4 leases of run time
		b.clock.Advance(lease * 6 / 10)
		waitfor.Condition(t, 5*time.Second, "heartbeat extends the lease", func() bool {
			return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE due_at >= $1`, b.clock.Now().Add(lease*9/10)) == 1
		})
		if stolen, err := q.ClaimExpired(ctx, "b", 10); err != nil || len(stolen) != 0 {
			t.Fatalf("another worker claimed a heartbeating job: %+v, %v", stolen, err)
		}
	}
	close(finish)
	waitfor.Value(t, 5*time.Second, "job done", 1, func() int {
		return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done' AND epoch = 1`)
	})
	stop()
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("effects: %d", n)
	}
}

// F12 at the queue level: a worker claims and dies (no release, no
// heartbeat; the kill -9 case); after the lease another worker redoes it.
func TestF12_DeadWorkersJobIsRedoneAfterLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	b.enqueue(t, q, 50, 5)
	if dead, err := q.Claim(ctx, "killed", 50, 0); err != nil || len(dead) != 50 {
		t.Fatalf("claim: %d, %v", len(dead), err)
	}
	w, err := leasequeue.NewWorker(q, func(_ context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		return recordEffect(job), nil
	}, fastWorker(leasequeue.WorkerConfig{Owner: "survivor", Workers: 4}))
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	if s, _ := q.Stats(ctx, b.pool); s.Running != 50 || s.ExpiredLeases != 0 {
		t.Fatalf("before expiry: %+v", s)
	}
	b.clock.Advance(lease + time.Millisecond)
	waitfor.Value(t, 5*time.Second, "every leased job redone", 50, func() int {
		return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done'`)
	})
	if n := b.count(t, `SELECT count(DISTINCT job_id) FROM effects`); n != 50 || b.count(t, `SELECT count(*) FROM effects`) != 50 {
		t.Fatalf("effects: want exactly one per job")
	}
}

// Three workers, 1,000 jobs, leases expiring at random moments (handlers
// jump the shared clock past the lease): every job takes effect exactly once.
func TestManyWorkersRandomLeaseExpiriesExactlyOnce(t *testing.T) {
	t.Parallel()
	for round := range 2 {
		b := setup(t)
		q := b.queue(t)
		const jobs = 1000
		b.enqueue(t, q, jobs, 1000)
		var expiries atomic.Int64
		h := func(_ context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
			if rand.IntN(50) == 0 {
				expiries.Add(1)
				b.clock.Advance(lease + time.Millisecond)
			}
			return recordEffect(job), nil
		}
		for i := range 3 {
			w, err := leasequeue.NewWorker(q, h, fastWorker(leasequeue.WorkerConfig{
				Owner: string(rune('a' + i)), Workers: 8, FetchBatch: 20,
			}))
			if err != nil {
				t.Fatal(err)
			}
			run(t, w)
		}
		// A liveness bound, not a speed target (benchmark B3 measures speed): wide
		// enough for 2,000 jobs on a loaded 2-core machine.
		waitfor.Value(t, 2*time.Minute, "all jobs done", jobs, func() int {
			return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done'`)
		})
		total := b.count(t, `SELECT count(*) FROM effects`)
		distinct := b.count(t, `SELECT count(DISTINCT job_id) FROM effects`)
		if total != jobs || distinct != jobs {
			t.Fatalf("round %d: %d effects for %d distinct jobs, want %d each", round, total, distinct, jobs)
		}
		t.Logf("round %d: %d injected expiries, %d fenced writes, %d rescues", round, expiries.Load(),
			b.counter(t, "leasequeue.lease.fenced"), b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE epoch > 1`))
	}
}

// A transient failure retries after a backoff (in the future, per the
// injected clock); a permanent one parks the job; an operator retry needs a
// ticket and an actor, is audited, and goes through the normal path.
func TestFailureRetryParkAndOperatorRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	b.enqueue(t, q, 1, 3)

	var mode atomic.Int32 // 0 transient, 1 permanent, 2 succeed
	w, err := leasequeue.NewWorker(q, func(_ context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		switch mode.Load() {
		case 0:
			return nil, errors.New("provider timeout")
		case 1:
			return nil, retry.Permanent(errors.New("invoice total overflows"))
		}
		return recordEffect(job), nil
	}, fastWorker(leasequeue.WorkerConfig{Owner: "w", Workers: 1}))
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	waitfor.Value(t, 5*time.Second, "transient failure scheduled for retry", 1, func() int {
		return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'available' AND attempts = 1
			AND last_error LIKE '%provider timeout%' AND due_at > $1`, b.clock.Now())
	})
	mode.Store(1)
	b.clock.Advance(time.Minute) // past the backoff cap
	waitfor.Value(t, 5*time.Second, "permanent failure parks the job", 1, func() int {
		return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'dead' AND last_error LIKE '%overflows%'`)
	})
	if got := b.counter(t, "leasequeue.jobs.dead"); got != 1 {
		t.Fatalf("dead counter = %d", got)
	}
	var id int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM leasequeue_jobs`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Retry(ctx, []int64{id}, "", "alice"); !errors.Is(err, leasequeue.ErrAuditRequired) {
		t.Fatalf("retry without ticket: %v", err)
	}
	if _, err := q.Retry(ctx, []int64{id}, "OPS-1", " "); !errors.Is(err, leasequeue.ErrAuditRequired) {
		t.Fatalf("retry without actor: %v", err)
	}
	// A dry run names the dead job only, and changes nothing.
	if would, err := q.RetryDryRun(ctx, b.pool, []int64{id, id + 1000}); err != nil || len(would) != 1 || would[0] != id {
		t.Fatalf("retry dry run: %v, %v", would, err)
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE id = $1 AND state = 'dead'`, id) +
		b.count(t, `SELECT count(*) FROM leasequeue_job_audit`); n != 1 {
		t.Fatal("the dry run changed the job or wrote an audit row")
	}
	mode.Store(2)
	got, err := q.Retry(ctx, []int64{id, id + 1000}, "OPS-1", "alice")
	if err != nil || len(got) != 1 || got[0] != id {
		t.Fatalf("retry: %v, %v", got, err)
	}
	waitfor.Value(t, 5*time.Second, "retried job done", 1, func() int {
		return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done'`)
	})
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 1 {
		t.Fatalf("effects: %d", n)
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_job_audit WHERE job_id = $1 AND action = 'retry'
		AND ticket = 'OPS-1' AND actor = 'alice' AND last_error LIKE '%overflows%'`, id); n != 1 {
		t.Fatalf("audit rows: %d", n)
	}
	// A second retry of a job that is no longer parked changes nothing, and
	// a dry run says so.
	if would, err := q.RetryDryRun(ctx, b.pool, []int64{id}); err != nil || len(would) != 0 {
		t.Fatalf("retry dry run of a done job: %v, %v", would, err)
	}
	if got, err := q.Retry(ctx, []int64{id}, "OPS-2", "alice"); err != nil || len(got) != 0 {
		t.Fatalf("retry of a done job: %v, %v", got, err)
	}
}

// A job that kills its worker on every attempt is parked when its lease
// expires on the last attempt, not claimed forever.
func TestExpiredOnLastAttemptIsParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	b.enqueue(t, q, 1, 2)
	for attempt := range 2 {
		var js []leasequeue.Job
		var err error
		if attempt == 0 {
			js, err = q.Claim(ctx, "dies", 1, 0)
		} else {
			js, err = q.ClaimExpired(ctx, "dies-again", 1)
		}
		if err != nil || len(js) != 1 {
			t.Fatalf("attempt %d: %v, %v", attempt, js, err)
		}
		b.clock.Advance(lease + time.Millisecond)
	}
	if js, err := q.ClaimExpired(ctx, "third", 1); err != nil || len(js) != 0 {
		t.Fatalf("claimed beyond max attempts: %v, %v", js, err)
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'dead' AND last_error LIKE 'lease expired on attempt 2 of 2%'`); n != 1 {
		t.Fatal("job not parked")
	}
}

// Graceful shutdown: a handler that finishes within the grace commits; one
// that does not is cancelled and its job released (claimable at once, the
// attempt given back).
func TestGracefulShutdownFinishesOrReleases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	b.enqueue(t, q, 2, 5)
	var started atomic.Int32
	allStarted := make(chan struct{})
	quick := make(chan struct{})
	w, err := leasequeue.NewWorker(q, func(ctx context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		if started.Add(1) == 2 {
			close(allStarted)
		}
		if job.ID == 1 {
			<-quick
			return recordEffect(job), nil
		}
		<-ctx.Done() // a long job that only stops when cancelled
		return nil, ctx.Err()
	}, fastWorker(leasequeue.WorkerConfig{Owner: "w", Workers: 2, ShutdownGrace: 200 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, w)
	<-allStarted
	go close(quick) // finishes during the grace
	stop()
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE id = 1 AND state = 'done'`); n != 1 {
		t.Fatal("quick job not completed during shutdown grace")
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE id = 2 AND state = 'available'
		AND attempts = 0 AND lease_owner IS NULL AND due_at <= $1`, b.clock.Now()); n != 1 {
		t.Fatal("long job not released")
	}
}

// A heartbeat that races its own claim's completion (the job is done before
// the heartbeat's UPDATE runs) must not report a lost lease: only another
// claim's epoch means lost. A false report would page on the lease-lost
// counter for healthy work.
func TestHeartbeatAfterOwnCompletionIsNotALostLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	b.enqueue(t, q, 1, 5)
	a, err := q.Claim(ctx, "worker-a", 10, 0)
	if err != nil || len(a) != 1 {
		t.Fatalf("claim: %+v, %v", a, err)
	}
	if err := q.Complete(ctx, a[0], nil); err != nil {
		t.Fatal(err)
	}
	lost, err := q.Heartbeat(ctx, a)
	if err != nil || len(lost) != 0 {
		t.Fatalf("heartbeat after own completion: lost=%v, %v; want none", lost, err)
	}
	if got := b.counter(t, "leasequeue.lease.lost"); got != 0 {
		t.Fatalf("lease-lost counter = %d, want 0", got)
	}
}

// A restarted instance (same Instance, new process) redoes the jobs its dead
// predecessor held at once, not after their lease; the predecessor's late
// completion is fenced off; a worker of ANOTHER instance leaves those leases
// alone until they expire.
func TestRestartedInstanceTakesBackItsLeasesAtOnceAndFencesItsPredecessor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	b.enqueue(t, q, 2, 5)

	// The dead incarnation of billing-1 holds both jobs (30 s lease, and the
	// test clock never advances: only a release can free them).
	dead, err := q.Claim(ctx, "billing-1/100-dead", 10, 0)
	if err != nil || len(dead) != 2 {
		t.Fatalf("dead incarnation's claim: %+v, %v", dead, err)
	}

	// Another instance starts first and works (it completes a new job), but
	// leaves billing-1's leases alone.
	handle := func(_ context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		return recordEffect(job), nil
	}
	other, err := leasequeue.NewWorker(q, handle, fastWorker(leasequeue.WorkerConfig{Instance: "billing-2", Workers: 2}))
	if err != nil {
		t.Fatal(err)
	}
	stopOther := run(t, other)
	b.enqueue(t, q, 1, 5)
	waitfor.Value(t, 10*time.Second, "billing-2 completes the new job", 1,
		func() int { return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done'`) })
	stopOther()
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'running' AND lease_owner = 'billing-1/100-dead' AND epoch = 1`); n != 2 {
		t.Fatalf("billing-2 touched billing-1's leases: %d of 2 still held", n)
	}

	restarted, err := leasequeue.NewWorker(q, handle, fastWorker(leasequeue.WorkerConfig{Instance: "billing-1", Workers: 2}))
	if err != nil {
		t.Fatal(err)
	}
	run(t, restarted)
	waitfor.Value(t, 10*time.Second, "the restarted billing-1 redoes its predecessor's jobs", 3,
		func() int { return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done'`) })

	for _, j := range dead {
		if err := q.Complete(ctx, j, recordEffect(j)); !errors.Is(err, leasequeue.ErrLeaseLost) {
			t.Fatalf("dead incarnation's late complete of job %d: %v, want ErrLeaseLost", j.ID, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM effects WHERE epoch = 1 AND job_id = ANY($1)`, []int64{dead[0].ID, dead[1].ID}); n != 0 {
		t.Fatalf("the dead incarnation's effects committed: %d", n)
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 3 {
		t.Fatalf("effects: %d, want 3 (one per job)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE id = ANY($1) AND attempts = 2 AND epoch >= 3`, []int64{dead[0].ID, dead[1].ID}); n != 2 {
		t.Fatalf("released jobs: want attempts 2 (the dead claim stays charged) and a new epoch")
	}
}

func TestWorkerConfigRefusesABadInstance(t *testing.T) {
	t.Parallel()
	for _, cfg := range []leasequeue.WorkerConfig{
		{Instance: "a/b"},
		{Instance: strings.Repeat("i", 101)},
		{Instance: "billing-1", Owner: "billing-2/1"},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", cfg)
		}
	}
	if err := (leasequeue.WorkerConfig{Instance: "billing-1.eu_west"}).Validate(); err != nil {
		t.Errorf("valid instance refused: %v", err)
	}
}
