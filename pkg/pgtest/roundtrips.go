package pgtest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
//
// It also counts the round trips that committed (Commits): those after which
// the connection is outside a transaction and whose last command was not a
// ROLLBACK (a statement in autocommit, read-only too, as pg_stat_database
// counts it; a COMMIT; a batch that ends with one). A round trip that
// commits twice (COMMIT, then a statement in an implicit transaction of its
// own, as a pgdb.Tx sends its notifications) counts once.
type RoundTrips struct {
	n, returned, commits atomic.Int64
}

// Load returns the round trips counted since the last Reset.
func (r *RoundTrips) Load() int64 { return r.n.Load() }

// Returned returns how many of the round trips counted since the last Reset
// have returned (their statement's or batch's result was read): a test can
// wait for a worker's poll to be over, not only sent.
func (r *RoundTrips) Returned() int64 { return r.returned.Load() }

// Commits returns how many of the round trips returned since the last Reset
// committed a transaction.
func (r *RoundTrips) Commits() int64 { return r.commits.Load() }

// Reset sets the counts to zero.
func (r *RoundTrips) Reset() { r.n.Store(0); r.returned.Store(0); r.commits.Store(0) }

// ended counts a returned round trip, and a commit when it ended one: the
// connection is idle after it and its last command did not roll back (a
// COMMIT of a failed transaction answers ROLLBACK).
func (r *RoundTrips) ended(conn *pgx.Conn, err error, last pgconn.CommandTag) {
	r.returned.Add(1)
	if err == nil && conn.PgConn().TxStatus() == 'I' && last.String() != "ROLLBACK" {
		r.commits.Add(1)
	}
}

// TraceQueryStart implements pgx.QueryTracer.
func (r *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (r *RoundTrips) TraceQueryEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	r.ended(conn, data.Err, data.CommandTag)
}

// batchKey carries a batch's last command tag from its statements to its
// end.
type batchKey struct{}

// TraceBatchStart implements pgx.BatchTracer.
func (r *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return context.WithValue(ctx, batchKey{}, new(pgconn.CommandTag))
}

// TraceBatchQuery implements pgx.BatchTracer: a batch's statements share
// its round trip.
func (r *RoundTrips) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if last, ok := ctx.Value(batchKey{}).(*pgconn.CommandTag); ok {
		*last = data.CommandTag
	}
}

// TraceBatchEnd implements pgx.BatchTracer.
func (r *RoundTrips) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	var last pgconn.CommandTag
	if p, ok := ctx.Value(batchKey{}).(*pgconn.CommandTag); ok {
		last = *p
	}
	r.ended(conn, data.Err, last)
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
