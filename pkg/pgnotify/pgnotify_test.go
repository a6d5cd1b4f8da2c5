package pgnotify_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgdb"
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

func TestNotifyInARawTransactionNotifiesAtCommitAndNotOnRollback(t *testing.T) {
	ctx := context.Background()
	pool := serverPool(t)
	l := listen(t, pool, "c2")

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pgnotify.Notify(ctx, tx, pgnotify.Notification{Channel: "c2", Payload: "rolled-back"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgnotify.Notify(ctx, tx, pgnotify.Notification{Channel: "c2", Payload: "committed"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.next(); got != "committed" {
		t.Fatalf("got %q, want the committed transaction's notification only", got)
	}
}

func TestNotifyFollowsTheHandle(t *testing.T) {
	ctx := context.Background()
	pool := serverPool(t)
	l := listen(t, pool, "c3")

	// Through a pool: sent at once, in a transaction of its own.
	if err := pgnotify.Notify(ctx, pool, pgnotify.Notification{Channel: "c3", Payload: "now"}); err != nil {
		t.Fatal(err)
	}
	if got := l.next(); got != "now" {
		t.Fatalf("got %q, want now", got)
	}
	// Through a pgdb.Tx: queued on it, sent after its commit.
	err := pgdb.InTx(ctx, pool, slog.New(slog.DiscardHandler), func(tx *pgdb.Tx) error {
		if err := pgnotify.Notify(ctx, tx, pgnotify.Notification{Channel: "c3", Payload: "after-commit"}); err != nil {
			return err
		}
		sentinel(t, pool, "c3") // while the transaction is open
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.next(); got != "sentinel" {
		t.Fatalf("got %q, want the sentinel: the notification left before the commit", got)
	}
	if got := l.next(); got != "after-commit" {
		t.Fatalf("got %q, want after-commit", got)
	}
	var sync string
	if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sync); err != nil || sync != "on" {
		t.Fatalf("synchronous_commit after a notification: %q, %v", sync, err)
	}
}
