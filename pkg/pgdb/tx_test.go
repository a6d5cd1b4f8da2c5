package pgdb_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// tables is the tests' and the Example's schema: one table t.
func tables() pgmigrate.Set {
	return pgmigrate.Set{Name: "pgdb_test", FS: fstest.MapFS{"00001_t.sql": {Data: []byte(
		"-- +goose Up\nCREATE TABLE t (x int PRIMARY KEY);\n")}}}
}

// txDB is a database with a table t of its own, a pool on it counting its
// round trips, and a listener on channel "w".
type txDB struct {
	pool *pgxpool.Pool
	rt   *pgtest.RoundTrips
	l    *pgx.Conn
}

func newTxDB(t *testing.T) *txDB {
	t.Helper()
	ctx := context.Background()
	pool, rt := pgtest.NewCountingPool(t, tables())
	l, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	if _, err := l.Exec(ctx, `LISTEN w`); err != nil {
		t.Fatal(err)
	}
	return &txDB{pool: pool, rt: rt, l: l}
}

// next returns the listener's next notification's payload.
func (d *txDB) next(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := d.l.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("no notification within 10s: %v", err)
	}
	return n.Payload
}

// sentinel notifies "w" from a session of its own. Notifications are
// delivered in commit order: when the listener's next one is the sentinel,
// nothing committed before it notified.
func (d *txDB) sentinel(t *testing.T) {
	t.Helper()
	if _, err := d.pool.Exec(context.Background(), `SELECT pg_notify('w', 'sentinel')`); err != nil {
		t.Fatal(err)
	}
}

func (d *txDB) rows(t *testing.T) []int {
	t.Helper()
	rows, err := d.pool.Query(context.Background(), `SELECT x FROM t ORDER BY x`)
	if err != nil {
		t.Fatal(err)
	}
	xs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return xs
}

// A transaction of a read and a write costs two round trips: BEGIN with
// the read, the write with COMMIT and the wake-up. The write is committed,
// the wake-up delivered once, after the commit, and the connection's
// synchronous_commit is untouched.
func TestTxBeginAndCommitRideWithTheStatements(t *testing.T) {
	ctx := context.Background()
	d := newTxDB(t)
	run := func(x int) {
		t.Helper()
		tx, err := pgdb.Begin(ctx, d.pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM t WHERE x < $1`, x).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != x-1 {
			t.Fatalf("read %d rows, want %d", n, x-1)
		}
		tx.Notify("w", "x")
		tx.Notify("w", "x") // a duplicate is sent once
		last := &pgx.Batch{}
		last.Queue(`INSERT INTO t VALUES ($1)`, x)
		if err := tx.CommitWith(ctx, last); err != nil {
			t.Fatal(err)
		}
	}
	run(1) // warm the statement cache
	d.rt.Reset()
	run(2)
	if n, c := d.rt.Load(), d.rt.Commits(); n != 2 || c != 1 {
		t.Fatalf("round trips %d, commits %d; want 2 and 1", n, c)
	}
	if got := d.rows(t); len(got) != 2 {
		t.Fatalf("rows %v, want [1 2]", got)
	}
	for range 2 {
		if got := d.next(t); got != "x" {
			t.Fatalf("notification %q", got)
		}
	}
	d.sentinel(t)
	if got := d.next(t); got != "sentinel" {
		t.Fatalf("extra notification %q: a duplicate was sent twice", got)
	}
	var sync string
	if err := d.pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sync); err != nil || sync != "on" {
		t.Fatalf("synchronous_commit after the pipeline: %q, %v", sync, err)
	}
	if n := d.pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}

// A transaction that needs no result before its commit costs one round
// trip: BEGIN, its statements, COMMIT and the wake-up in one batch.
func TestInTxOfQueuedStatementsIsOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	d := newTxDB(t)
	run := func(x int) {
		t.Helper()
		err := pgdb.InTx(ctx, d.pool, nil, func(tx *pgdb.Tx) error {
			tx.Queue(`INSERT INTO t VALUES ($1)`, x)
			tx.Notify("w", "one")
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	run(1)
	d.rt.Reset()
	run(2)
	if n := d.rt.Load(); n != 1 {
		t.Fatalf("round trips %d, want 1", n)
	}
	if got := d.rows(t); len(got) != 2 {
		t.Fatalf("rows %v, want [1 2]", got)
	}
	if got := d.next(t); got != "one" {
		t.Fatalf("notification %q", got)
	}
}

// A statement that fails before the COMMIT means no commit and no
// wake-up: the server skips the rest of the batch, the transaction rolls
// back, and the connection goes back to the pool usable.
func TestTxFailureBeforeCommitCommitsAndNotifiesNothing(t *testing.T) {
	ctx := context.Background()
	d := newTxDB(t)
	ran := false
	err := pgdb.InTx(ctx, d.pool, nil, func(tx *pgdb.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, 1); err != nil {
			return err
		}
		tx.Notify("w", "x")
		tx.AfterCommit(func(context.Context) { ran = true })
		tx.Queue(`INSERT INTO t VALUES (1/0)`)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "division by zero") {
		t.Fatalf("InTx: %v, want the failed statement's error", err)
	}
	if ran {
		t.Fatal("an after-commit action ran after a rollback")
	}
	d.sentinel(t)
	if got := d.next(t); got != "sentinel" {
		t.Fatalf("notification %q after a rollback", got)
	}
	if got := d.rows(t); len(got) != 0 {
		t.Fatalf("rows %v after a rollback", got)
	}
	if n := d.pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}

// An error of fn rolls back: nothing committed, no wake-up, no
// after-commit action. On success the actions run after the commit and the
// wake-up.
func TestInTxAfterCommitActionsRunOnlyAfterACommit(t *testing.T) {
	ctx := context.Background()
	d := newTxDB(t)
	refused := errors.New("business rule refused")
	var ran []string
	err := pgdb.InTx(ctx, d.pool, nil, func(tx *pgdb.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, 1); err != nil {
			return err
		}
		tx.Notify("w", "rolled-back")
		tx.AfterCommit(func(context.Context) { ran = append(ran, "rolled-back") })
		return refused
	})
	if !errors.Is(err, refused) {
		t.Fatalf("InTx: %v, want fn's error as is", err)
	}
	err = pgdb.InTx(ctx, d.pool, nil, func(tx *pgdb.Tx) error {
		tx.AfterCommit(func(context.Context) {
			ran = append(ran, "committed")
			var n int
			if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 1 {
				t.Errorf("after commit: %d rows (%v), want the committed one", n, err)
			}
		})
		tx.Notify("w", "committed")
		_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, 2)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ran, ",") != "committed" {
		t.Fatalf("after-commit actions run: %v, want [committed]", ran)
	}
	if got := d.next(t); got != "committed" {
		t.Fatalf("notification %q, want committed only", got)
	}
	if got := d.rows(t); len(got) != 1 || got[0] != 2 {
		t.Fatalf("rows %v, want [2]", got)
	}
}

// A savepoint that rolls back keeps the outer transaction: its writes and
// wake-ups are dropped, the outer ones commit. One that sends nothing
// costs nothing.
func TestTxSavepointRollbackKeepsTheOuterTransaction(t *testing.T) {
	ctx := context.Background()
	d := newTxDB(t)
	err := pgdb.InTx(ctx, d.pool, nil, func(tx *pgdb.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, 1); err != nil {
			return err
		}
		tx.Notify("w", "outer")
		// A failing nested transaction rolls back its savepoint only.
		err := pgdb.InTx(ctx, tx, nil, func(sp *pgdb.Tx) error {
			if _, err := sp.Exec(ctx, `INSERT INTO t VALUES ($1)`, 2); err != nil {
				return err
			}
			sp.Notify("w", "inner-rolled-back")
			_, err := sp.Exec(ctx, `INSERT INTO t VALUES ($1)`, 1) // duplicate key
			return err
		})
		if err == nil {
			t.Error("a failing savepoint returned nil")
		}
		// A savepoint that commits keeps its writes and wake-ups.
		if err := pgdb.InTx(ctx, tx, nil, func(sp *pgdb.Tx) error {
			sp.Notify("w", "inner-kept")
			_, err := sp.Exec(ctx, `INSERT INTO t VALUES ($1)`, 3)
			return err
		}); err != nil {
			return err
		}
		// One that sends nothing sends no SAVEPOINT.
		d.rt.Reset()
		if err := pgdb.InTx(ctx, tx, nil, func(*pgdb.Tx) error { return nil }); err != nil {
			return err
		}
		if n := d.rt.Load(); n != 0 {
			t.Errorf("an empty savepoint cost %d round trips", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.rows(t); len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Fatalf("rows %v, want [1 3]", got)
	}
	got := []string{d.next(t), d.next(t)}
	if strings.Join(got, ",") != "inner-kept,outer" {
		t.Fatalf("notifications %v, want [inner-kept outer] (sorted)", got)
	}
	d.sentinel(t)
	if got := d.next(t); got != "sentinel" {
		t.Fatalf("notification %q of a rolled-back savepoint", got)
	}
}

// Inside a transaction begun elsewhere, a Tx is a savepoint of it and its
// wake-ups follow that transaction: none when it rolls back.
func TestTxInsideARawTransactionFollowsTheOuterOne(t *testing.T) {
	ctx := context.Background()
	d := newTxDB(t)
	outer, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = pgdb.InTx(ctx, outer, nil, func(tx *pgdb.Tx) error {
		tx.Notify("w", "x")
		_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, 1)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := outer.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the outer transaction sees %d rows (%v), want 1", n, err)
	}
	if err := outer.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	d.sentinel(t)
	if got := d.next(t); got != "sentinel" {
		t.Fatalf("notification %q of a rolled-back outer transaction", got)
	}
	if got := d.rows(t); len(got) != 0 {
		t.Fatalf("rows %v after the outer rollback", got)
	}
}

// A statement that must stop the commit fails in the server (AssertSQL): a
// COMMIT queued behind it never runs, and the transaction is left open,
// aborted, for Rollback.
func TestTxAssertionStopsTheCommit(t *testing.T) {
	ctx := context.Background()
	d := newTxDB(t)
	tx, err := pgdb.Begin(ctx, d.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, 1); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT `+pgdb.AssertSQL("count(*) = $1", "'t has ' || count(*) || ' rows'")+` FROM t`, int64(2))
	err = tx.CommitWith(ctx, b)
	if !pgdb.IsAssertion(err, "t has 1 rows") {
		t.Fatalf("commit after a failed assertion: %v, want the assertion", err)
	}
	if tx.Closed() {
		t.Fatal("transaction reported closed: the COMMIT ran")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := d.rows(t); len(got) != 0 {
		t.Fatalf("rows %v: the batch committed", got)
	}
}
