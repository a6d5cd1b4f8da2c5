package pgdb_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Errors PostgreSQL raises for the values a statement carried are data
// errors, not outages, also when wrapped.
func TestRealDataErrorsAreDataNotUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, pgtest.ServerDSN(t))
	if _, err := conn.Exec(ctx, `CREATE TEMP TABLE t (n int CHECK (n > 0))`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, code string
		run        func() error
	}{
		{"NUL byte in text", "22021", func() error {
			_, err := conn.Exec(ctx, `SELECT $1::text`, "paint\x00the fence")
			return err
		}},
		{"NUL escape in jsonb", "22P05", func() error {
			_, err := conn.Exec(ctx, `SELECT '{"d": "\u0000"}'::jsonb ->> 'd'`)
			return err
		}},
		{"CHECK violation", "23514", func() error {
			_, err := conn.Exec(ctx, `INSERT INTO t VALUES (-1)`)
			return err
		}},
	} {
		err := fmt.Errorf("store: %w", tc.run())
		if got := sqlstate(err); got != tc.code {
			t.Fatalf("%s: SQLSTATE %q (%v), want %s", tc.name, got, err, tc.code)
		}
		if !pgdb.IsData(err) || pgdb.IsUnavailable(err) {
			t.Errorf("%s: IsData=%v IsUnavailable=%v, want data only", tc.name, pgdb.IsData(err), pgdb.IsUnavailable(err))
		}
	}
}

// Nothing listens: connecting is refused.
func TestRefusedConnectionIsUnavailable(t *testing.T) {
	t.Parallel()
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	_ = lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pgx.Connect(ctx, fmt.Sprintf("postgres://app@127.0.0.1:%d/db?sslmode=disable&connect_timeout=2", port))
	if err == nil {
		t.Fatal("connected to a closed port")
	}
	if !pgdb.IsUnavailable(err) || pgdb.IsData(err) {
		t.Fatalf("%v: IsUnavailable=%v IsData=%v, want unavailable only", err, pgdb.IsUnavailable(err), pgdb.IsData(err))
	}
}

// The server stops under a pool: the statement on the open connection and
// the reconnect after it both fail as unavailable; once it is back, the pool
// works again.
func TestStoppedServerIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgtest.StartCluster(ctx, pgtest.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Remove)
	cfg, err := pgxpool.ParseConfig(cluster.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // the pooled connection, then new connects
		var one int
		err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one)
		if err == nil {
			t.Fatalf("query %d succeeded on a stopped server", i)
		}
		if !pgdb.IsUnavailable(err) || pgdb.IsData(err) {
			t.Fatalf("query %d: %v: IsUnavailable=%v IsData=%v, want unavailable only", i, err, pgdb.IsUnavailable(err), pgdb.IsData(err))
		}
	}
	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

// A statement cut by statement_timeout (57014) is unavailability; a syntax
// error is neither class: a bug.
func TestStatementTimeoutIsUnavailableAndSyntaxErrorIsNeither(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, pgtest.ServerDSN(t))
	if _, err := conn.Exec(ctx, `SET statement_timeout = '50ms'`); err != nil {
		t.Fatal(err)
	}
	_, err := conn.Exec(ctx, `SELECT pg_sleep(5)`)
	if sqlstate(err) != "57014" || !pgdb.IsUnavailable(err) || pgdb.IsData(err) {
		t.Fatalf("statement timeout: %v (SQLSTATE %q): IsUnavailable=%v IsData=%v", err, sqlstate(err), pgdb.IsUnavailable(err), pgdb.IsData(err))
	}
	_, err = conn.Exec(ctx, `SELEC 1`)
	if sqlstate(err) != "42601" || pgdb.IsUnavailable(err) || pgdb.IsData(err) {
		t.Fatalf("syntax error: %v: IsUnavailable=%v IsData=%v, want neither", err, pgdb.IsUnavailable(err), pgdb.IsData(err))
	}
}
