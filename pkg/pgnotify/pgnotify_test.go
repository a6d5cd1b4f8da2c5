package pgnotify_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgnotify"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// serverPool is a pool on the test server's own database: notifications
// need no tables. Each test uses channels of its own.
func serverPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.ServerDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// listener is one LISTENing session; next returns its next notification.
type listener struct {
	t    *testing.T
	conn *pgx.Conn
}

func listen(t *testing.T, pool *pgxpool.Pool, channel string) *listener {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return &listener{t: t, conn: conn}
}

func (l *listener) next() string {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := l.conn.WaitForNotification(ctx)
	if err != nil {
		l.t.Fatalf("no notification within 10s: %v", err)
	}
	return n.Payload
}

// sentinel notifies channel from a session of its own. Notifications are
// delivered in commit order: when the listener's next one is the sentinel,
// nothing committed before it notified.
func sentinel(t *testing.T, pool *pgxpool.Pool, channel string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "SELECT pg_notify($1, 'sentinel')", channel); err != nil {
		t.Fatal(err)
	}
}

func TestDeferredSendIsDeliveredOnlyAtFlushAfterTheCommit(t *testing.T) {
	ctx := context.Background()
	pool := serverPool(t)
	l := listen(t, pool, "c1")

	ctx, notes := pgnotify.Defer(ctx)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, p := range []string{"7", "7", "3"} { // a duplicate is sent once
			if err := pgnotify.Send(ctx, tx, "c1", p); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Committed, not flushed: the commit notified nobody.
	sentinel(t, pool, "c1")
	if got := l.next(); got != "sentinel" {
		t.Fatalf("first notification %q, want the sentinel: the business commit notified", got)
	}
	notes.Flush(ctx, pool, slog.New(slog.DiscardHandler))
	got := []string{l.next(), l.next()}
	sentinel(t, pool, "c1")
	if g := l.next(); g != "sentinel" {
		t.Fatalf("third notification after Flush %q, want the sentinel: the duplicate was sent twice", g)
	}
	if strings.Join(got, ",") != "3,7" {
		t.Fatalf("after Flush got %v, want [3 7]", got)
	}
	// A second Flush sends nothing more.
	notes.Flush(ctx, pool, slog.New(slog.DiscardHandler))
	sentinel(t, pool, "c1")
	if g := l.next(); g != "sentinel" {
		t.Fatalf("second Flush sent %q again", g)
	}
}

func TestSendWithoutDeferNotifiesAtCommitAndNotOnRollback(t *testing.T) {
	ctx := context.Background()
	pool := serverPool(t)
	l := listen(t, pool, "c2")

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgnotify.Send(ctx, tx, "c2", "rolled-back"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return pgnotify.Send(ctx, tx, "c2", "committed") })
	if err != nil {
		t.Fatal(err)
	}
	if got := l.next(); got != "committed" {
		t.Fatalf("got %q, want the committed transaction's notification only", got)
	}
}

func TestNotifyRefusesATransactionAndAnnounceFollowsTheHandle(t *testing.T) {
	ctx := context.Background()
	pool := serverPool(t)
	l := listen(t, pool, "c3")

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgnotify.Notify(ctx, tx, pgnotify.Notification{Channel: "c3", Payload: "x"}); err == nil {
			t.Error("Notify inside a transaction: no error; it would make that commit non-durable")
		}
		// Announce through a transaction: delivered at its commit.
		return pgnotify.Announce(ctx, tx, pgnotify.Notification{Channel: "c3", Payload: "in-tx"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.next(); got != "in-tx" {
		t.Fatalf("got %q, want in-tx", got)
	}
	// Announce through the pool: sent at once, in a transaction of its own.
	if err := pgnotify.Announce(ctx, pool, pgnotify.Notification{Channel: "c3", Payload: "now"}); err != nil {
		t.Fatal(err)
	}
	if got := l.next(); got != "now" {
		t.Fatalf("got %q, want now", got)
	}
}

// hookedPool runs afterCommit right after each of its transactions
// commits, before Begin's caller goes on: InTx's commit and its flush can
// be told apart.
type hookedPool struct {
	*pgxpool.Pool
	afterCommit func()
}

func (p hookedPool) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := p.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return hookedTx{Tx: tx, afterCommit: p.afterCommit}, nil
}

type hookedTx struct {
	pgx.Tx
	afterCommit func()
}

func (tx hookedTx) Commit(ctx context.Context) error {
	if err := tx.Tx.Commit(ctx); err != nil {
		return err
	}
	tx.afterCommit()
	return nil
}

// table creates a table of the test's own on the server's database and
// returns its name.
func table(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	name := pgx.Identifier{"pgnotify_" + strings.ToLower(t.Name())}.Sanitize()
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+name+" (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+name) })
	return name
}

// rows counts the rows of table, committed ones only (pool).
func rows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestInTxSendsTheNotificationsAfterTheCommitOnce(t *testing.T) {
	ctx := context.Background()
	pool := serverPool(t)
	jobs := table(t, pool)
	l := listen(t, pool, "c4")
	db := hookedPool{Pool: pool, afterCommit: func() { sentinel(t, pool, "c4") }}

	err := pgnotify.InTx(ctx, db, slog.New(slog.DiscardHandler), func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+jobs+" VALUES (1)"); err != nil {
			return err
		}
		for _, p := range []string{"7", "7", "3"} { // a duplicate is sent once
			if err := pgnotify.Send(ctx, tx, "c4", p); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The sentinel was sent right after the commit: had the commit
	// notified, its notifications would come first.
	if got := l.next(); got != "sentinel" {
		t.Fatalf("first notification %q, want the sentinel: the business commit notified", got)
	}
	got := []string{l.next(), l.next()}
	if strings.Join(got, ",") != "3,7" {
		t.Fatalf("after the commit got %v, want [3 7]", got)
	}
	// Woken, a listener finds the row.
	if n := rows(t, pool, jobs); n != 1 {
		t.Fatalf("%d rows when the notification arrived, want 1", n)
	}
	sentinel(t, pool, "c4")
	if g := l.next(); g != "sentinel" {
		t.Fatalf("notification %q after the flush, want the sentinel: the duplicate was sent twice", g)
	}
}

func TestInTxRollsBackAndSendsNothingOnError(t *testing.T) {
	ctx := context.Background()
	pool := serverPool(t)
	jobs := table(t, pool)
	l := listen(t, pool, "c5")
	failed := errors.New("business rule refused")

	err := pgnotify.InTx(ctx, pool, slog.New(slog.DiscardHandler), func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+jobs+" VALUES (1)"); err != nil {
			return err
		}
		if err := pgnotify.Send(ctx, tx, "c5", "rolled-back"); err != nil {
			return err
		}
		return failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("InTx returned %v, want fn's error as is", err)
	}
	if n := rows(t, pool, jobs); n != 0 {
		t.Fatalf("%d rows after the rollback, want 0", n)
	}
	sentinel(t, pool, "c5")
	if got := l.next(); got != "sentinel" {
		t.Fatalf("got %q, want the sentinel: a rolled-back transaction notified", got)
	}
}

func TestInTxInsideATransactionFollowsTheOuterOne(t *testing.T) {
	ctx := context.Background()
	pool := serverPool(t)
	jobs := table(t, pool)
	l := listen(t, pool, "c6")
	logger := slog.New(slog.DiscardHandler)

	// The outer transaction deferred its notifications: the inner InTx
	// collects into them instead of sending at its savepoint's release.
	outerCtx, notes := pgnotify.Defer(ctx)
	err := pgx.BeginFunc(outerCtx, pool, func(outer pgx.Tx) error {
		if err := pgnotify.InTx(outerCtx, outer, logger, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+jobs+" VALUES (1)"); err != nil {
				return err
			}
			return pgnotify.Send(ctx, tx, "c6", "kept")
		}); err != nil {
			return err
		}
		// A failing inner InTx rolls back its savepoint only.
		err := pgnotify.InTx(outerCtx, outer, logger, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+jobs+" VALUES (2)"); err != nil {
				return err
			}
			return errors.New("refused")
		})
		if err == nil {
			t.Error("a failing inner InTx returned nil")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := rows(t, pool, jobs); n != 1 {
		t.Fatalf("%d rows, want 1: the inner savepoints committed or rolled back the wrong writes", n)
	}
	sentinel(t, pool, "c6")
	if got := l.next(); got != "sentinel" {
		t.Fatalf("got %q before the outer Flush, want the sentinel: the inner InTx sent on its own", got)
	}
	notes.Flush(ctx, pool, logger)
	if got := l.next(); got != "kept" {
		t.Fatalf("got %q after the outer Flush, want kept", got)
	}
}
