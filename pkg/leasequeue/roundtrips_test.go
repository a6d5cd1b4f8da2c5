package leasequeue_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pgnotify"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// The round trips of each primitive a job goes through, pinned: at a
// database's distance each is a network round trip of a job's path (B7).
// A change that adds one fails here.
func TestPrimitiveRoundTrips(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, leasequeue.Migrations(""))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (job_id bigint NOT NULL, epoch bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	q, err := leasequeue.New(pool, leasequeue.Config{Name: "test", LeaseDuration: lease,
		Backoff: retry.Backoff{Base: time.Second, Max: time.Minute}},
		slog.New(slog.NewJSONHandler(io.Discard, nil)), nil, leasequeue.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	count := func(name string, want int64, f func()) {
		t.Helper()
		for range 2 { // the first warms the connections' statement caches
			rt.Reset()
			f()
		}
		if got := rt.Load(); got != want {
			t.Errorf("%s: %d round trips, want %d", name, got, want)
		}
	}
	claim := func() leasequeue.Job {
		t.Helper()
		if _, err := q.Enqueue(ctx, pool, leasequeue.NewJob{Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		jobs, err := q.Claim(ctx, "w", 1, 0)
		if err != nil || len(jobs) != 1 {
			t.Fatalf("claim: %v, %v", jobs, err)
		}
		return jobs[0]
	}
	var job leasequeue.Job
	count("claim", 1, func() {
		if _, err := q.Enqueue(ctx, pool, leasequeue.NewJob{Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		rt.Reset()
		if jobs, err := q.Claim(ctx, "w", 1, 0); err != nil || len(jobs) != 1 {
			t.Fatalf("claim: %v, %v", jobs, err)
		} else {
			job = jobs[0]
		}
	})
	count("heartbeat", 1, func() {
		if lost, err := q.Heartbeat(ctx, []leasequeue.Job{job}); err != nil || len(lost) != 0 {
			t.Fatalf("heartbeat: %v, %v", lost, err)
		}
	})
	count("rescue (park and claim expired leases)", 1, func() {
		if _, err := q.ClaimExpired(ctx, "w", 10); err != nil {
			t.Fatal(err)
		}
	})
	count("fail", 1, func() {
		j := claim()
		rt.Reset()
		if err := q.Fail(ctx, j, errors.New("no")); err != nil {
			t.Fatal(err)
		}
	})
	count("complete, no effects", 1, func() {
		j := claim()
		rt.Reset()
		if err := q.Complete(ctx, j, nil); err != nil {
			t.Fatal(err)
		}
	})
	count("complete, one statement and a wake-up", 2, func() {
		j := claim()
		rt.Reset()
		if err := q.Complete(ctx, j, func(ctx context.Context, tx pgx.Tx) error {
			if err := recordEffect(j)(ctx, tx); err != nil {
				return err
			}
			return pgnotify.Notify(ctx, tx, pgnotify.Notification{Channel: "effects"})
		}); err != nil {
			t.Fatal(err)
		}
	})
	// A stale claim's completion: the first try's done mark fails in the
	// server before the effect runs, the second learns the claim is lost.
	count("complete, fenced off", 4, func() {
		j := claim()
		clk.Advance(lease + time.Millisecond)
		if _, err := q.ClaimExpired(ctx, "w2", 10); err != nil {
			t.Fatal(err)
		}
		rt.Reset()
		if err := q.Complete(ctx, j, recordEffect(j)); !errors.Is(err, leasequeue.ErrLeaseLost) {
			t.Fatalf("stale claim's complete: %v, want ErrLeaseLost", err)
		}
	})
	if n := countOn(t, pool, `SELECT count(*) FROM effects`); n != 2 {
		t.Fatalf("effects: %d, want one per completion", n)
	}
}

// The wake-ups a completion's effects announce go out with its COMMIT, in
// the same batch: delivered once the transaction committed, never for one
// that rolled back.
func TestCompletionWakeUpsFollowTheCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, `LISTEN effects`); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, q, 2, 1)
	jobs, err := q.Claim(ctx, "w", 2, 0)
	if err != nil || len(jobs) != 2 {
		t.Fatalf("claim: %v, %v", jobs, err)
	}
	announce := func(j leasequeue.Job, payload string, fail bool) leasequeue.Complete {
		return func(ctx context.Context, tx pgx.Tx) error {
			if err := recordEffect(j)(ctx, tx); err != nil {
				return err
			}
			if err := pgnotify.Notify(ctx, tx, pgnotify.Notification{Channel: "effects", Payload: payload}); err != nil {
				return err
			}
			if fail {
				return retry.Permanent(errors.New("effect refused"))
			}
			return nil
		}
	}
	if err := q.Complete(ctx, jobs[0], announce(jobs[0], "rolled back", true)); err == nil {
		t.Fatal("a failing effect completed its job")
	}
	if err := q.Complete(ctx, jobs[1], announce(jobs[1], "committed", false)); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != "committed" {
		t.Fatalf("first wake-up %q, want the committed one's", n.Payload)
	}
	if got := b.count(t, `SELECT count(*) FROM effects`); got != 1 {
		t.Fatalf("effects: %d rows, want the committed one only", got)
	}
	if got := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done'`); got != 1 {
		t.Fatalf("done jobs: %d, want 1", got)
	}
	if got := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'dead'`); got != 1 {
		t.Fatalf("parked jobs: %d, want 1 (its effect failed permanently)", got)
	}
}

func countOn(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// An effect may nest transactions in its tx (savepoints): the one that
// commits stays, the one that rolls back is undone, the job is done.
func TestCompletionEffectsMayNestTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	b.enqueue(t, q, 1, 1)
	jobs, err := q.Claim(ctx, "w", 1, 0)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claim: %v, %v", jobs, err)
	}
	j := jobs[0]
	err = q.Complete(ctx, j, func(ctx context.Context, tx pgx.Tx) error {
		if err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return recordEffect(j)(ctx, sp) }); err != nil {
			return err
		}
		undone := errors.New("undone")
		if err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			if err := recordEffect(j)(ctx, sp); err != nil {
				return err
			}
			return undone
		}); !errors.Is(err, undone) {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.count(t, `SELECT count(*) FROM effects WHERE job_id = $1`, j.ID); got != 1 {
		t.Fatalf("effects: %d, want the committed savepoint's only", got)
	}
	if got := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE id = $1 AND state = 'done'`, j.ID); got != 1 {
		t.Fatalf("job not done")
	}
}
