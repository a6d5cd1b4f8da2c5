package pgnotify_test

import (
	"context"
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
