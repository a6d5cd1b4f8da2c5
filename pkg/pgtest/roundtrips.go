package pgtest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// RoundTrips counts the round trips to PostgreSQL of the connections it
// traces: one per statement sent alone (Exec, Query, QueryRow, and the BEGIN,
// SAVEPOINT, RELEASE and COMMIT of pgx's transactions, which pgx sends as
// statements) and one per pgx.Batch, however many statements it holds. The
// extended protocol's parse of a statement not yet in a connection's cache
// is a round trip too but is not counted: warm the path once, Reset, then
// measure. A test that pins the number of round trips of a path fails when
// a change adds one, which no timing test on loopback could see.
type RoundTrips struct {
	n, returned atomic.Int64
}

// Load returns the round trips counted since the last Reset.
func (r *RoundTrips) Load() int64 { return r.n.Load() }

// Returned returns how many of the round trips counted since the last Reset
// have returned (their statement's or batch's result was read): a test can
// wait for a worker's poll to be over, not only sent.
func (r *RoundTrips) Returned() int64 { return r.returned.Load() }

// Reset sets both counts to zero.
func (r *RoundTrips) Reset() { r.n.Store(0); r.returned.Store(0) }

// TraceQueryStart implements pgx.QueryTracer.
func (r *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (r *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {
	r.returned.Add(1)
}

// TraceBatchStart implements pgx.BatchTracer.
func (r *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer: a batch's statements share
// its round trip.
func (r *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (r *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	r.returned.Add(1)
}

var (
	_ pgx.QueryTracer = (*RoundTrips)(nil)
	_ pgx.BatchTracer = (*RoundTrips)(nil)
)

// NewCountingPool is NewPool whose connections count their round trips on
// the returned RoundTrips.
func NewCountingPool(t testing.TB, sets ...pgmigrate.Set) (*pgxpool.Pool, *RoundTrips) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(NewDatabase(t, sets...))
	if err != nil {
		t.Fatalf("pgtest: parse config: %v", err)
	}
	rt := &RoundTrips{}
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, rt
}
