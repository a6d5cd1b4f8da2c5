package pgleader_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgleader"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testSchema is a retention table like pkg/consumer's processed_events: the
// business effect the singleton loop has.
func testSchema() pgmigrate.Set {
	return pgmigrate.Set{Name: "pgleader_test", Schema: "public", VersionTable: "pgleader_test_version", FS: fstest.MapFS{
		"00001_markers.sql": {Data: []byte(`-- +goose Up
CREATE TABLE markers (id bigint PRIMARY KEY, expired boolean NOT NULL);
CREATE TABLE deletions (replica int NOT NULL, id bigint NOT NULL);
`)},
	}}
}

// cleanup is one replica's retention loop: it deletes expired markers in
// small batches, records which replica deleted each row, and repeats until
// cancelled (every few milliseconds, so three unguarded replicas would
// overlap constantly).
//
// running counts the replicas inside their loop at this moment; overlaps
// records every time a replica entered while another was inside, which is
// what the lock must make impossible.
func cleanup(pool *pgxpool.Pool, replica int, running, overlaps *atomic.Int64) pgleader.Task {
	const q = `
WITH gone AS (
    DELETE FROM markers WHERE id IN (SELECT id FROM markers WHERE expired ORDER BY id LIMIT 10)
    RETURNING id
)
INSERT INTO deletions SELECT $1, id FROM gone`
	return pgleader.Task{Name: "cleanup", Run: func(ctx context.Context) error {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		defer running.Add(-1)
		for ctx.Err() == nil {
			if _, err := pool.Exec(ctx, q, replica); err != nil && ctx.Err() == nil {
				return err
			}
		}
		return nil
	}}
}

func TestThreeReplicas_OneCleansEachExpiredRowOnce_AnotherTakesOverWhenItsSessionDies(t *testing.T) {
	pool := pgtest.NewPool(t, testSchema())
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO markers SELECT g, g % 2 = 0 FROM generate_series(1, 400) g`); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// CheckInterval also bounds the check query: short enough for a quick
	// test, long enough that a loaded machine does not time the check out
	// (which closes the session, and ends the leadership by design).
	cfg := pgleader.Config{Name: "test-singletons", RetryInterval: 20 * time.Millisecond, CheckInterval: time.Second}

	runCtx, stop := context.WithCancel(ctx)
	leaders := make([]*pgleader.Leader, 3)
	var running, overlaps atomic.Int64
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	for i := range leaders {
		l, err := pgleader.New(pool, cfg, logger, nil)
		if err != nil {
			t.Fatal(err)
		}
		leaders[i] = l
		wg.Add(1)
		go func() { defer wg.Done(); errs <- l.Run(runCtx, cleanup(pool, i, &running, &overlaps)) }()
	}
	t.Cleanup(func() { stop(); wg.Wait() })

	count := func(q string) int {
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	leading := func() (n, who int) {
		for i, l := range leaders {
			if l.Leading() {
				n, who = n+1, i
			}
		}
		return n, who
	}
	waitfor.Condition(t, 10*time.Second, "every expired marker deleted", func() bool {
		return count(`SELECT count(*) FROM markers WHERE expired`) == 0
	})
	// A leader that steps down stops its loop before it lets go of the lock,
	// so no two replicas ever ran the loop at once, and every row was
	// deleted once, whoever led.
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d times a replica ran the cleanup while another was running it", n)
	}
	if got, dup := count(`SELECT count(*) FROM deletions`), count(`SELECT count(*) - count(DISTINCT id) FROM deletions`); got != 200 || dup != 0 {
		t.Fatalf("%d deletions (%d duplicates), want each of the 200 expired markers once", got, dup)
	}
	if got := count(`SELECT count(*) FROM markers`); got != 200 {
		t.Fatalf("%d markers left, want the 200 live ones", got)
	}
	var first int
	waitfor.Condition(t, 10*time.Second, "exactly one replica leads", func() bool {
		n, who := leading()
		first = who
		return n == 1
	})

	// The leader's session dies (failover, network cut): its loop stops and
	// another replica takes over and cleans what expired since.
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 10*time.Second, "another replica leads", func() bool {
		n, who := leading()
		return n == 1 && who != first
	})
	if _, err := pool.Exec(ctx, `UPDATE markers SET expired = true WHERE id <= 100`); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 10*time.Second, "newly expired markers deleted", func() bool {
		return count(`SELECT count(*) FROM markers WHERE expired`) == 0
	})
	// No overlap check here: until the old leader notices its lost session
	// (at most CheckInterval) both run, as the package documents; the rows
	// are still deleted once each.
	if got, dup := count(`SELECT count(*) FROM deletions`), count(`SELECT count(*) - count(DISTINCT id) FROM deletions`); got != 250 || dup != 0 {
		t.Fatalf("%d deletions (%d duplicates), want 250 distinct", got, dup)
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}

func TestATaskErrorStopsTheLeaderNamingTheTask(t *testing.T) {
	pool := pgtest.NewPool(t, testSchema())
	l, err := pgleader.New(pool, pgleader.Config{Name: "failing"}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = l.Run(context.Background(), pgleader.Task{Name: "broken", Run: func(context.Context) error { return io.ErrUnexpectedEOF }})
	if err == nil || err.Error() != "broken: unexpected EOF" {
		t.Fatalf("err = %v, want the task named", err)
	}
	if l.Leading() {
		t.Fatal("still leading after the task failed")
	}
}

func TestConfigValidation(t *testing.T) {
	if _, err := pgleader.New(nil, pgleader.Config{Name: "x"}, slog.Default(), nil); err == nil {
		t.Fatal("nil pool accepted")
	}
	if err := (pgleader.Config{}).Validate(); err == nil {
		t.Fatal("empty Name accepted")
	}
	if err := (pgleader.Config{Name: "x", RetryInterval: -1}).Validate(); err == nil {
		t.Fatal("negative RetryInterval accepted")
	}
}

// N3: the leader's connection goes half-open (the server stops answering,
// nothing is closed). The leader stops its loops within 2 x CheckInterval,
// and while the path stays dead it keeps trying the lock on fresh
// connections, each try bounded by CheckInterval, instead of waiting for
// ever on a pooled connection that will never answer. After the path heals,
// one replica leads again.
func TestStalledLeaderConnection_LeadershipEndsWithinBound_TriesAgainOnFreshConnections(t *testing.T) {
	dsn, proxy := pgtest.StallDSN(t, pgtest.NewDatabase(t, testSchema()))
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Two pooled connections: one becomes the lock's session, the other
	// stays idle in the pool and goes half-open with it.
	c1, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c1.Release()
	c2.Release()

	const check = time.Second
	l, err := pgleader.New(pool, pgleader.Config{Name: "stalled", RetryInterval: 20 * time.Millisecond, CheckInterval: check},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- l.Run(runCtx, pgleader.Task{Name: "idle", Run: func(ctx context.Context) error { <-ctx.Done(); return nil }})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitfor.Condition(t, 10*time.Second, "leading", l.Leading)

	proxy.Stall()
	start := time.Now()
	// Bound 2 x CheckInterval, plus slack for a loaded machine.
	waitfor.Condition(t, 2*check+4*time.Second, "leadership given up on a dead connection", func() bool { return !l.Leading() })
	t.Logf("leadership ended %v after the stall", time.Since(start))

	accepted := proxy.Accepted()
	waitfor.Condition(t, 10*check, "new connections tried while the path is dead", func() bool {
		return proxy.Accepted() >= accepted+2
	})

	proxy.Heal()
	waitfor.Condition(t, 20*time.Second, "leading again after heal", l.Leading)
}

// cancelAfterTryLock cancels the run's context the moment the try-lock
// query has answered, before Run sees the answer: shutdown racing a lock
// just taken.
type cancelAfterTryLock struct{ cancel context.CancelFunc }

type tryLockKey struct{}

func (c cancelAfterTryLock) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, tryLockKey{}, strings.Contains(d.SQL, "pg_try_advisory_lock"))
}

func (c cancelAfterTryLock) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if try, _ := ctx.Value(tryLockKey{}).(bool); try && d.Err == nil {
		c.cancel()
	}
}

// A lock taken as the run is cancelled is released with its session: the
// pool gets its connection back (its Close does not wait for ever) and
// another replica leads at once.
func TestShutdownAsTheLockIsTaken_ReleasesTheLockAndTheConnection(t *testing.T) {
	dsn := pgtest.NewDatabase(t, testSchema())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = cancelAfterTryLock{cancel: cancel}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := pgleader.New(pool, pgleader.Config{Name: "shutdown-race"}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	if err := l.Run(ctx, pgleader.Task{Name: "never", Run: func(context.Context) error { ran.Store(true); return nil }}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if ran.Load() || l.Leading() {
		t.Fatal("led after the run was cancelled")
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connection(s) still acquired after Run returned", n)
	}
	closed := make(chan struct{})
	go func() { pool.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the pool's Close waited for a connection Run never gave back")
	}

	other, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	l2, err := pgleader.New(other, pgleader.Config{Name: "shutdown-race", RetryInterval: 20 * time.Millisecond}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- l2.Run(runCtx, pgleader.Task{Name: "idle", Run: func(ctx context.Context) error { <-ctx.Done(); return nil }})
	}()
	waitfor.Condition(t, 10*time.Second, "another replica leads", l2.Leading)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
