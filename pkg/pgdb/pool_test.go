package pgdb_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func show(t *testing.T, pool *pgxpool.Pool, setting string) string {
	t.Helper()
	var v string
	if err := pool.QueryRow(context.Background(), "SHOW "+setting).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func TestNewSetsDefaultTimeouts(t *testing.T) {
	t.Parallel()
	pool, err := pgdb.New(context.Background(), pgtest.NewDatabase(t, emptySet), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := show(t, pool, "statement_timeout"); got != "30s" {
		t.Errorf("statement_timeout = %s, want 30s", got)
	}
	if got := show(t, pool, "lock_timeout"); got != "10s" {
		t.Errorf("lock_timeout = %s, want 10s", got)
	}
	if got := show(t, pool, "plan_cache_mode"); got != "auto" {
		t.Errorf("plan_cache_mode = %s, want the server's auto", got)
	}
	if got := pool.Config().ConnConfig.ConnectTimeout; got != 5*time.Second {
		t.Errorf("connect timeout = %v, want 5s", got)
	}
	if got := pool.Config().MaxConns; got != pgdb.DefaultMaxConns {
		t.Errorf("max conns = %d, want %d", got, pgdb.DefaultMaxConns)
	}
}

// A query that runs longer than the statement timeout is cancelled by the
// server (57014), on both pools, so a stuck query cannot hold a connection
// for ever.
func TestStatementTimeoutCancelsALongQuery(t *testing.T) {
	t.Parallel()
	pools, err := pgdb.Open(context.Background(), pgdb.Config{
		URL: pgtest.NewDatabase(t, emptySet), StatementTimeout: 100 * time.Millisecond, LockTimeout: 50 * time.Millisecond,
	}, telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	defer pools.Close()
	for name, pool := range map[string]*pgxpool.Pool{"api": pools.API, "workers": pools.Workers} {
		start := time.Now()
		_, err := pool.Exec(context.Background(), "SELECT pg_sleep(5)")
		if sqlState(err) != "57014" {
			t.Errorf("%s: pg_sleep(5) under a 100ms statement_timeout: %v, want SQLSTATE 57014", name, err)
		}
		if d := time.Since(start); d > 4*time.Second {
			t.Errorf("%s: the query ran %v", name, d)
		}
	}
}

// A statement that waits for a row lock longer than the lock timeout fails
// with 55P03 instead of queueing behind the holder.
func TestLockTimeoutEndsALockWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pools, err := pgdb.Open(ctx, pgdb.Config{
		URL: pgtest.NewDatabase(t, emptySet), LockTimeout: 100 * time.Millisecond,
	}, telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	defer pools.Close()
	if _, err := pools.Workers.Exec(ctx, "CREATE TABLE locked (id int PRIMARY KEY); INSERT INTO locked VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	holder, err := pools.Workers.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, "SELECT 1 FROM locked WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	_, err = pools.API.Exec(ctx, "UPDATE locked SET id = 1 WHERE id = 1")
	if sqlState(err) != "55P03" {
		t.Fatalf("update of a locked row: %v, want SQLSTATE 55P03", err)
	}
}

// Settings in DATABASE_URL win over the configured ones.
func TestURLSettingsWin(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t, emptySet)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	dsn += sep + "statement_timeout=7000&lock_timeout=3000&connect_timeout=2&pool_max_conns=3&options=-c%20plan_cache_mode%3Dauto"
	pools, err := pgdb.Open(context.Background(), pgdb.Config{URL: dsn, PlanCacheMode: "force_generic_plan"}, telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	defer pools.Close()
	for name, pool := range map[string]*pgxpool.Pool{"api": pools.API, "workers": pools.Workers} {
		if got := show(t, pool, "statement_timeout"); got != "7s" {
			t.Errorf("%s: statement_timeout = %s, want the URL's 7s", name, got)
		}
		if got := show(t, pool, "lock_timeout"); got != "3s" {
			t.Errorf("%s: lock_timeout = %s, want the URL's 3s", name, got)
		}
		if got := show(t, pool, "plan_cache_mode"); got != "auto" {
			t.Errorf("%s: plan_cache_mode = %s, want the URL's auto", name, got)
		}
		if got := pool.Config().ConnConfig.ConnectTimeout; got != 2*time.Second {
			t.Errorf("%s: connect timeout = %v, want the URL's 2s", name, got)
		}
		if got := pool.Config().MaxConns; got != 3 {
			t.Errorf("%s: max conns = %d, want the URL's 3", name, got)
		}
	}
}

// The API pool and the workers' pool are separate: with every API
// connection taken, the workers still get theirs at once.
func TestAPIPoolExhaustionLeavesTheWorkersPoolFree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pools, err := pgdb.Open(ctx, pgdb.Config{URL: pgtest.NewDatabase(t, emptySet), APIMaxConns: 2, WorkerMaxConns: 4}, telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	defer pools.Close()
	for range 2 {
		c, err := pools.API.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if c, err := pools.API.Acquire(short); err == nil {
		c.Release()
		t.Fatal("a third API connection was handed out; want the API pool capped at 2")
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if _, err := pools.Workers.Exec(wctx, "SELECT 1"); err != nil {
		t.Fatalf("workers' pool while the API pool is exhausted: %v", err)
	}
}

// emptySet gives pgtest something to migrate: these tests need a database,
// not a schema.
var emptySet = pgmigrate.Set{Name: "empty", FS: fstest.MapFS{
	"00001_empty.sql": {Data: []byte("-- +goose Up\nSELECT 1;\n-- +goose Down\nSELECT 1;\n")},
}}

// A statement inside a recording span is a span of its own with its text and
// operation, without the connection's details (the same for every span of a
// service); outside one, no span.
func TestStatementSpansCarryTheQueryNotTheConnection(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	pool, err := pgdb.New(context.Background(), pgtest.NewDatabase(t, emptySet), telemetry.Providers{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), "SELECT 1"); err != nil { // no recording span: not traced
		t.Fatal(err)
	}
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	if _, err := pool.Exec(ctx, "SELECT 2"); err != nil {
		t.Fatal(err)
	}
	parent.End()
	var stmt sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == "db.query.text" {
				if kv.Value.AsString() != "SELECT 2" {
					t.Errorf("a statement span of %q; want only SELECT 2 traced", kv.Value.AsString())
				}
				stmt = s
			}
		}
	}
	if stmt == nil {
		t.Fatalf("no statement span among %d spans", len(rec.Ended()))
	}
	for _, kv := range stmt.Attributes() {
		switch kv.Key {
		case "server.address", "server.port", "user.name", "db.namespace":
			t.Errorf("statement span carries %s=%s; want no connection details", kv.Key, kv.Value.String())
		}
	}
}

// PlanCacheMode reaches every connection of both pools; unset, the server's
// own setting stays (TestNewSetsDefaultTimeouts).
func TestPlanCacheModeReachesEveryConnection(t *testing.T) {
	t.Parallel()
	pools, err := pgdb.Open(context.Background(), pgdb.Config{
		URL: pgtest.NewDatabase(t, emptySet), PlanCacheMode: "force_generic_plan",
	}, telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	defer pools.Close()
	for name, pool := range map[string]*pgxpool.Pool{"api": pools.API, "workers": pools.Workers} {
		if got := show(t, pool, "plan_cache_mode"); got != "force_generic_plan" {
			t.Errorf("%s: plan_cache_mode = %s, want force_generic_plan", name, got)
		}
	}
}

// Ids travel as uuid.UUID both ways, alone, in arrays and nullable, with
// the bytes PostgreSQL's text form names.
func TestUUIDsRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgdb.New(ctx, pgtest.NewDatabase(t, emptySet), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	u, v := uuid.MustParse("0190c1e2-3f4a-7b5c-8d6e-9f0a1b2c3d4e"), uuid.New()
	var (
		text     string
		one      uuid.UUID
		many     []uuid.UUID
		null     *uuid.UUID
		nullable *uuid.UUID
	)
	if err := pool.QueryRow(ctx, `SELECT $1::uuid::text, $1::uuid, $2::uuid[], $3::uuid, $4::uuid`,
		u, []uuid.UUID{v, uuid.Nil, u}, (*uuid.UUID)(nil), &v).Scan(&text, &one, &many, &null, &nullable); err != nil {
		t.Fatal(err)
	}
	if text != u.String() || one != u {
		t.Errorf("uuid %s: the server read %s, scanned back %s", u, text, one)
	}
	if len(many) != 3 || many[0] != v || many[1] != uuid.Nil || many[2] != u {
		t.Errorf("uuid[]: %v", many)
	}
	if null != nil || nullable == nil || *nullable != v {
		t.Errorf("nullable: NULL scanned as %v, %s as %v", null, v, nullable)
	}
	if err := pool.QueryRow(ctx, `SELECT NULL::uuid`).Scan(&one); err == nil {
		t.Error("NULL scanned into a uuid.UUID without an error")
	}
}
