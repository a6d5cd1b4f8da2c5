package pgnotify_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgnotify"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// countingServerPool is serverPool whose connections count round trips.
func countingServerPool(t *testing.T) (*pgxpool.Pool, *pgtest.RoundTrips) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.ServerDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	rt := &pgtest.RoundTrips{}
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, rt
}

// A pipelined transaction of a read and a write costs two round trips:
// BEGIN with the read, the write with COMMIT and the notification. The
// write is committed, the notification delivered once.
func TestPipelinedCommitsAndNotifiesInTwoRoundTrips(t *testing.T) {
	ctx := context.Background()
	pool, rt := countingServerPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE pipelined_ok (x int)`); err != nil {
		t.Fatal(err)
	}
	l := listen(t, pool, "p1")
	run := func(x int) {
		t.Helper()
		var one int
		first := &pgx.Batch{}
		first.Queue(`SELECT 1`).QueryRow(func(r pgx.Row) error { return r.Scan(&one) })
		txCtx, p, err := pgnotify.Begin(ctx, pool, nil, first)
		if err != nil {
			t.Fatal(err)
		}
		if one != 1 {
			t.Fatalf("first batch's callback: %d", one)
		}
		if err := pgnotify.Send(txCtx, p.Tx(), "p1", "x"); err != nil {
			t.Fatal(err)
		}
		last := &pgx.Batch{}
		last.Queue(`INSERT INTO pipelined_ok VALUES ($1)`, x)
		if err := p.Commit(ctx, last); err != nil {
			t.Fatal(err)
		}
	}
	run(1) // warm the statement cache
	rt.Reset()
	run(2)
	if n := rt.Load(); n != 2 {
		t.Fatalf("round trips %d, want 2", n)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pipelined_ok`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows %d, %v; want 2", n, err)
	}
	if got := l.next(); got != "x" {
		t.Fatalf("notification %q", got)
	}
	if got := l.next(); got != "x" {
		t.Fatalf("notification %q", got)
	}
	sentinel(t, pool, "p1")
	if got := l.next(); got != "sentinel" {
		t.Fatalf("extra notification %q", got)
	}
	var sync string
	if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sync); err != nil || sync != "on" {
		t.Fatalf("synchronous_commit after the pipeline: %q, %v", sync, err)
	}
}

// A statement that fails before the COMMIT rolls the transaction back:
// nothing committed, nothing notified, the connection usable again.
func TestPipelinedFailureBeforeCommitRollsBackAndNotifiesNothing(t *testing.T) {
	ctx := context.Background()
	pool, _ := countingServerPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE pipelined_fail (x int)`); err != nil {
		t.Fatal(err)
	}
	l := listen(t, pool, "p2")
	txCtx, p, err := pgnotify.Begin(ctx, pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Tx().Exec(txCtx, `INSERT INTO pipelined_fail VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if err := pgnotify.Send(txCtx, p.Tx(), "p2", "x"); err != nil {
		t.Fatal(err)
	}
	last := &pgx.Batch{}
	last.Queue(`INSERT INTO pipelined_fail VALUES (1/0)`)
	if err := p.Commit(ctx, last); err == nil {
		t.Fatal("commit after a failed statement succeeded")
	}
	p.Rollback(ctx) // after Commit: nothing
	sentinel(t, pool, "p2")
	if got := l.next(); got != "sentinel" {
		t.Fatalf("notification %q after a rollback", got)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pipelined_fail`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows %d, %v; want 0", n, err)
	}
	if idle := pool.Stat().AcquiredConns(); idle != 0 {
		t.Fatalf("%d connections still acquired", idle)
	}
}

// Inside the caller's transaction Begin is a savepoint and the
// notifications follow the outer transaction (InTx's rule).
func TestPipelinedInsideATransactionFollowsTheOuterOne(t *testing.T) {
	ctx := context.Background()
	pool, _ := countingServerPool(t)
	l := listen(t, pool, "p3")
	outer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	txCtx, p, err := pgnotify.Begin(ctx, outer, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgnotify.Send(txCtx, p.Tx(), "p3", "x"); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := outer.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	sentinel(t, pool, "p3")
	if got := l.next(); got != "sentinel" {
		t.Fatalf("notification %q of a rolled-back outer transaction", got)
	}
}
