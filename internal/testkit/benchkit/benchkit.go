// Package benchkit is what the benchmarks share (B1 and B2 in bench/outbox,
// B1p in bench/outboxpubsub, B1w and B3 in their own modules): the PostgreSQL
// claim anchors of docs/performance.md, verbatim, a backlog of outbox rows
// shaped like production's, and the environment knobs (sizes, durations, the
// test server's fsync and pg_stat_statements), which the pattern packages of
// pkg/ do not read. Like pgtest, its helpers take a testing.TB and stop the
// benchmark on error. Fill and WaitDrained work on the outbox of the
// session's search_path, the default schema of outbox.Migrations("") that
// the benchmarks create.
package benchkit

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// Claim selects an anchor claim loop.
type Claim int

const (
	// Keyset claims and marks, in one statement, the 100 rows after the last
	// id claimed. It stays flat on a backlog.
	Keyset Claim = iota + 1
	// Naive is the plain SKIP LOCKED claim: 100 rows from the start
	// of the partial index, which walks the dead entries of the rows marked
	// before it until vacuum removes them.
	Naive
)

// AnchorPayload is the anchors' row payload, also used as the payload of the
// no-op benchmarks' events.
const AnchorPayload = `{"order_id":"ord_0123456789","amount_cents":12345,"currency":"USD","kind":"OrderCompleted"}`

// The anchors' table and claims, as docs/performance.md defines them. The
// fill takes the row count and payload as parameters; the claims are verbatim.
const (
	anchorSetup = `
DROP TABLE IF EXISTS q;
CREATE TABLE q (id bigserial PRIMARY KEY, status text NOT NULL DEFAULT 'PENDING', payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());`
	anchorFill   = `INSERT INTO q(status, payload) SELECT 'PENDING', $2::jsonb FROM generate_series(1, $1::int)`
	anchorIndex  = `CREATE INDEX q_pending_idx ON q(id) WHERE status='PENDING'`
	anchorNaive  = `WITH c AS (SELECT id FROM q WHERE status='PENDING' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED) UPDATE q SET status='DONE' FROM c WHERE q.id=c.id`
	anchorKeyset = `WITH c AS (SELECT id FROM q WHERE status='PENDING' AND id > $1 ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED), u AS (UPDATE q SET status='DONE' FROM c WHERE q.id=c.id RETURNING q.id) SELECT coalesce(max(id), $1) AS last FROM u`
)

// Anchor runs one anchor claim loop, on one connection, over a fresh table q
// of n rows, for at most d or until every row is claimed, and returns rows
// claimed per second.
func Anchor(tb testing.TB, pool *pgxpool.Pool, claim Claim, n int, d time.Duration) float64 {
	tb.Helper()
	if claim != Keyset && claim != Naive {
		tb.Fatalf("benchkit: unknown claim %d", claim)
	}
	ctx := context.Background()
	exec(tb, pool, anchorSetup)
	exec(tb, pool, anchorFill, n, AnchorPayload)
	exec(tb, pool, anchorIndex)
	exec(tb, pool, `VACUUM ANALYZE q`)
	pgtest.Checkpoint(tb)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Release()
	var last int64 // Keyset: the cursor; ids are 1..n, so it is also the count
	claimed := 0
	start := time.Now()
	for time.Since(start) < d && claimed < n {
		if claim == Keyset {
			if err := conn.QueryRow(ctx, anchorKeyset, last).Scan(&last); err != nil {
				tb.Fatal(err)
			}
			claimed = int(last)
			continue
		}
		tag, err := conn.Exec(ctx, anchorNaive)
		if err != nil {
			tb.Fatal(err)
		}
		claimed += int(tag.RowsAffected())
	}
	return float64(claimed) / time.Since(start).Seconds()
}

// Backlog is a batch of outbox rows to write with Fill.
type Backlog struct {
	// Events is the number of rows.
	Events int
	// EventType and Payload are those of every row.
	EventType string
	Payload   []byte
	// Headers are every row's headers (correlation id, traceparent).
	Headers map[string]string
}

// qFill writes rows [$1, $2) of a backlog in one statement. Event ids are
// shaped like the UUIDv7 of outbox.NewEvent (time first, so the unique index
// takes appends), and row g belongs to aggregate 'wo-' || (g % $3): with $3 a
// quarter of the backlog, every aggregate has four events spread across it,
// so the relay's per-aggregate ordering guard is exercised as it is by work
// orders that emit several events each.
const qFill = `
INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, headers, occurred_at)
SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7' ||
        substr(md5(g::text), 1, 19))::uuid, 'work_order', 'wo-' || (g % $3), $4, $5, $6, now()
FROM generate_series($1::int, $2::int - 1) g`

// Fill empties outbox and outbox_published, writes the backlog 10,000 rows
// per statement, then vacuums, analyzes and checkpoints, so that the
// measurement that follows starts from a settled table.
func Fill(tb testing.TB, pool *pgxpool.Pool, bl Backlog) {
	tb.Helper()
	headers, err := json.Marshal(bl.Headers)
	if err != nil {
		tb.Fatal(err)
	}
	exec(tb, pool, `TRUNCATE outbox, outbox_published`)
	for from := 0; from < bl.Events; from += 10_000 {
		exec(tb, pool, qFill, from, min(from+10_000, bl.Events), max(bl.Events/4, 1), bl.EventType, bl.Payload, headers)
	}
	exec(tb, pool, `VACUUM ANALYZE outbox`)
	pgtest.Checkpoint(tb)
}

// WaitDrained waits until dispatched reports n events and the outbox is
// empty. A drain that stalls has lost work: the benchmark fails instead of
// hanging, after 10 minutes without reaching n, or a minute with events
// dispatched but still in the outbox. dispatched should read a counter: a
// count(*) per poll would compete with the relay for the database.
func WaitDrained(tb testing.TB, pool *pgxpool.Pool, n int, dispatched func() int64) {
	tb.Helper()
	if !waitfor.Until(10*time.Minute, func() bool { return dispatched() >= int64(n) }) {
		tb.Fatalf("drain stalled: %d of %d events dispatched", dispatched(), n)
	}
	var left int
	if !waitfor.Until(time.Minute, func() bool {
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&left); err != nil {
			tb.Fatal(err)
		}
		return left == 0
	}) {
		tb.Fatalf("%d events dispatched but still in the outbox", left)
	}
}

// Median returns the median of xs (the mean of the middle two for an even
// count), the figure docs/performance.md quotes for pairwise ratios.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Summary is a figure over a benchmark's rounds: the median quoted, and the
// range that says how far to trust it.
type Summary struct{ Median, Min, Max float64 }

// Summarize returns the median and range of xs.
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	return Summary{Median(xs), slices.Min(xs), slices.Max(xs)}
}

// Spread is the range relative to the median (0.1: the rounds lie within 10 %
// of the median's size of each other).
func (s Summary) Spread() float64 {
	if s.Median == 0 {
		return 0
	}
	return (s.Max - s.Min) / s.Median
}

// String renders "median (min–max, spread %)".
func (s Summary) String() string {
	return fmt.Sprintf("%.2f (%.2f–%.2f, spread %.0f %%)", s.Median, s.Min, s.Max, 100*s.Spread())
}

// EnvInts reads a comma-separated list of positive integers, a sweep's
// settings (def when unset), as EnvInt reads one.
func EnvInts(tb testing.TB, name string, def []int) []int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			tb.Fatalf("%s=%q: want positive integers separated by commas", name, v)
		}
		out = append(out, n)
	}
	return out
}

// EnvWords reads a comma-separated list of words, each one of allowed (def
// when unset).
func EnvWords(tb testing.TB, name string, def, allowed []string) []string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []string
	for f := range strings.SplitSeq(v, ",") {
		w := strings.TrimSpace(f)
		if !slices.Contains(allowed, w) {
			tb.Fatalf("%s=%q: %q is not one of %s", name, v, w, strings.Join(allowed, ", "))
		}
		out = append(out, w)
	}
	return out
}

// EnvInt and EnvDuration read a benchmark knob from the environment: def
// when unset; a value that is not positive, or does not parse, stops the
// benchmark naming the variable rather than silently running the default.
func EnvInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// EnvDuration: see EnvInt.
func EnvDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		tb.Fatalf("%s=%q: want a positive duration such as 60s", name, v)
	}
	return d
}

func exec(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	tb.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}
