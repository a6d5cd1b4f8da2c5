package e2e

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/devtools/loadgen"
	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// Definitions of benchmark B5.
const (
	// b5AnchorClients run the commit-rate anchor of docs/performance.md (a
	// 1-row insert, one commit each).
	b5AnchorClients = 16
	// b5StatsSettle lets every backend flush its transaction counts to
	// pg_stat_database before a reading. PostgreSQL 15 flushes at a
	// transaction's end at most once a second; a backend that then goes idle
	// with counts pending flushes them after PGSTAT_IDLE_INTERVAL, 10 s. With
	// the 2 s this was, the last second of each pooled connection's
	// commits was missing from a reading (billing's commits fell short of the
	// transactions pg_stat_statements counted), so commits per order read low.
	b5StatsSettle = 11 * time.Second
	// b5ProfileDelay is how far into the 50 % phase the CPU profiles start:
	// past the ramp-up of the open loop.
	b5ProfileDelay = 2 * time.Second
	// b5TopStatements is how many of PostgreSQL's statements the table on
	// stderr names (b5_statements.csv has them all).
	b5TopStatements = 15
	// b5MaxProfile stays below the services' HTTP write timeout (15 s by
	// default), which bounds a profile request.
	b5MaxProfile = 14 * time.Second
	// Targets.
	b5CapacityTarget = 0.5 // capacity ÷ commit-bound limit, at least
	b5FloorTarget    = 2.0 // p50 at 10 % ÷ measured floor, at most
	b5P99Target      = time.Second
)

// BenchmarkB5_EndToEndLatency measures create→invoiced latency under
// open-loop load at 10% and 50% of the system's measured capacity (benchmark
// B5 of docs/performance.md), decomposed into the hops of package orderhop,
// against a floor and a capacity bound measured in the same run:
//
//   - floor: LOSSLESS_B5_FLOOR_N orders one at a time (each invoiced before
//     the next is created); each hop's minimum over them, summed;
//   - capacity bound: the server's 16-client 1-row-insert commit rate
//     (measured before and after the capacity probe, averaged) ÷ the
//     commits one order costs (pg_stat_database xact_commit across the
//     services' databases over the capacity probe ÷ orders invoiced; every
//     transaction counts, read-only polls included);
//   - capacity: the sustained rate of the closed-loop probe, from the
//     INVOICED times of its middle 80% (b5Sustained).
//
// Hop latencies come from the databases' own timestamps after each phase
// (see b5Times). During the 50% phase a CPU profile of every service is
// fetched from its /debug/pprof/ (PPROF_ADDR, a loopback port of its own) and its top 10 functions
// printed. Environment:
//
//	LOSSLESS_B5_DURATION   open-loop phase length (default 60s; the design's run is 5m)
//	LOSSLESS_B5_CAPACITY_N orders of the closed-loop capacity probe (default 600)
//	LOSSLESS_B5_FLOOR_N    orders of the one-at-a-time floor probe (default 30)
//	LOSSLESS_B5_ANCHOR     length of each commit-rate anchor run (default 5s)
//	LOSSLESS_B5_PROFILE    CPU profile length during the 50% phase (default 10s, at most 14s)
//	LOSSLESS_BENCH_DATA    directory for b5_hops.csv, b5_latency.csv, b5_rate.csv and the
//	                       profiles (default for the profiles: bench/profiles)
//	LOSSLESS_PG_FSYNC=on   fsync on the test PostgreSQL server (make bench)
//	LOSSLESS_PG_STAT_STATEMENTS=on
//	                       pg_stat_statements on that server (make bench): the statements
//	                       it spent the 50% phase on, in b5_statements.csv and on stderr
func BenchmarkB5_EndToEndLatency(b *testing.B) {
	ctx := context.Background()
	duration := envDuration(b, "LOSSLESS_B5_DURATION", time.Minute)
	capN := envInt(b, "LOSSLESS_B5_CAPACITY_N", 600)
	floorN := envInt(b, "LOSSLESS_B5_FLOOR_N", 30)
	anchorFor := envDuration(b, "LOSSLESS_B5_ANCHOR", 5*time.Second)
	profileFor := min(envDuration(b, "LOSSLESS_B5_PROFILE", 10*time.Second), b5MaxProfile, duration-b5ProfileDelay-time.Second)
	dataDir := os.Getenv("LOSSLESS_BENCH_DATA")
	profDir := dataDir
	if profDir == "" {
		_, thisFile, _, _ := runtime.Caller(0)
		profDir = filepath.Join(filepath.Dir(filepath.Dir(thisFile)), "bench", "profiles")
	}

	stack, base := startBenchStack(b, "b5_", true)
	dbs := b5Open(ctx, b, stack)
	server := pgtest.ServerDSN(b)

	b.ResetTimer()
	for range b.N {
		var all []b5Order // every order of the run, for the rate series
		phases := map[string][]b5Order{}

		// The floor: one order at a time, nothing else in flight.
		var floorIDs []string
		for i := range floorN {
			res := b5Load(ctx, b, "floor", loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second), BaseURL: base, Count: 1, Concurrency: 1, MaxPositions: 10, Wait: time.Minute, Seed: uint64(100 + i)})
			floorIDs = append(floorIDs, res.OrderIDs...)
		}
		phases["floor"] = dbs.times(ctx, b, floorIDs)
		all = append(all, phases["floor"]...)
		minima := b5Minima(phases["floor"])
		var floor time.Duration
		for _, m := range minima {
			floor += m
		}

		// Capacity, between two commit-rate anchors (A B A).
		anchorA := b5CommitRate(ctx, b, server, anchorFor)
		b5Pause(b5StatsSettle) // the floor's commits flushed before the reading
		probeStats := b5ResetStatements(ctx, b, server)
		commitsBefore := dbs.commits(ctx, b)
		commitsByDB := b7Commits(ctx, b, server, dbs.names)
		walBefore := walMarkNow(ctx, b, server)
		cpuBefore := b5CPUNow(ctx, b, stack, dbs.workorder)
		capRes := b5Load(ctx, b, "capacity probe", loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second), BaseURL: base, Count: capN, Concurrency: 64, MaxPositions: 10, Wait: 5 * time.Minute, Seed: 7})
		cpuAfter := b5CPUNow(ctx, b, stack, dbs.workorder)
		cpu := b5CPUDelta(cpuBefore, cpuAfter)
		// Statements and commits are both read after the settle, so that
		// both count the same span: the probe and the workers' idle polls of
		// the settle's seconds.
		b5Pause(b5StatsSettle)
		var probeStatements []b5Statement
		if probeStats {
			probeStatements = b5Statements(ctx, b, server, dbs.names)
		}
		commitsPerOrder := float64(dbs.commits(ctx, b)-commitsBefore) / float64(capRes.Invoiced)
		wal := walSince(ctx, b, server, walBefore)
		var hopCost []b5HopCost
		if probeStats {
			after := b7Commits(ctx, b, server, dbs.names)
			delta := map[string]int64{}
			for db, n := range after {
				delta[db] = n - commitsByDB[db]
			}
			hopCost = b5HopCosts(probeStatements, delta, capRes.Invoiced)
		}
		anchorB := b5CommitRate(ctx, b, server, anchorFor)
		phases["capacity"] = dbs.times(ctx, b, capRes.OrderIDs)
		all = append(all, phases["capacity"]...)
		capacity := b5Sustained(b, phases["capacity"])
		commitRate := (anchorA + anchorB) / 2
		bound := commitRate / commitsPerOrder
		capRatio := capacity / bound

		// The open-loop phases; CPU profiles and the server's statement
		// statistics during the 50 % one.
		var profiles []b5Profile
		var statsOn bool
		for _, load := range []struct {
			name string
			frac float64
		}{{"10pct", 0.1}, {"50pct", 0.5}} {
			var wg sync.WaitGroup
			if load.name == "50pct" && profileFor >= time.Second {
				wg.Go(func() { profiles = b5Profiles(ctx, b, stack, profDir, profileFor) })
			}
			if load.name == "50pct" {
				statsOn = b5ResetStatements(ctx, b, server)
			}
			res := b5Load(ctx, b, load.name, loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second),
				BaseURL: base, Rate: capacity * load.frac, Duration: duration, Concurrency: 64, MaxPositions: 10, Wait: 5 * time.Minute, Seed: 11,
			})
			wg.Wait()
			phases[load.name] = dbs.times(ctx, b, res.OrderIDs)
			all = append(all, phases[load.name]...)
		}

		// Report.
		b.ReportMetric(capacity, "capacity_orders/s")
		b.ReportMetric(capRes.InvoicedPerSec, "probe_orders/s")
		b.ReportMetric(commitRate, "anchor_commits/s")
		b.ReportMetric(commitsPerOrder, "commits/order")
		// Durable cost (wal_bench_test.go): write transactions (commit
		// records) and WAL flushes per order; the read-only transactions
		// are commits/order less the first.
		b.ReportMetric(perOrder(wal.writeXacts, capRes.Invoiced), "write_xacts/order")
		// Of those, the durable steps and the wake-ups (NOTIFYs on their own,
		// synchronous_commit off: walWakeUp).
		b.ReportMetric(perOrder(wal.durable, capRes.Invoiced), "durable_xacts/order")
		b.ReportMetric(perOrder(wal.wakeUps, capRes.Invoiced), "wakeup_xacts/order")
		b.ReportMetric(float64(wal.flushes)/float64(capRes.Invoiced), "wal_flushes/order")
		b.ReportMetric(commitsPerOrder-perOrder(wal.writeXacts, capRes.Invoiced), "read_only_xacts/order")
		if wal.shapes != nil {
			for svc, n := range walShapesByService(wal.shapes, dbs.names) {
				b.ReportMetric(perOrder(n, capRes.Invoiced), "write_xacts/order_db_"+svc)
			}
		}
		b.ReportMetric(capRatio, "capacity/commit_bound")
		b.ReportMetric(b5Ms(floor), "floor_ms")
		for _, k := range append(b5CPUGroups(cpu), b5CPUMachine) {
			b.ReportMetric(b5Ms(cpu[k])/float64(capRes.Invoiced), "cpu_ms/order_"+k)
		}
		b5HopCostMetrics(b, hopCost)
		if hopCost != nil {
			b.ReportMetric(b5SystemCommits(hopCost), "commits/order_system")
		}
		e2e := map[string][]time.Duration{}
		for _, ph := range []string{"floor", "10pct", "50pct"} {
			e2e[ph] = b5EndToEnd(phases[ph])
		}
		p50at10 := b5Pct(e2e["10pct"], 50)
		p99at50 := b5Pct(e2e["50pct"], 99)
		for _, ph := range []string{"10pct", "50pct"} {
			b.ReportMetric(b5Ms(b5Pct(e2e[ph], 50)), "p50_ms_"+ph)
			b.ReportMetric(b5Ms(b5Pct(e2e[ph], 99)), "p99_ms_"+ph)
			for i, hop := range orderhop.Path {
				lat := b5HopLatencies(phases[ph], i)
				b.ReportMetric(b5Ms(b5Pct(lat, 50)), "p50_ms_"+string(hop)+"_"+ph)
				b.ReportMetric(b5Ms(b5Pct(lat, 99)), "p99_ms_"+string(hop)+"_"+ph)
			}
		}
		b.ReportMetric(float64(p50at10)/float64(floor), "p50/floor_10pct")

		// The table goes to stderr: a benchmark's log keeps only 10 lines.
		var tbl strings.Builder
		// The capacity probe's columns show where its orders queued while
		// the machine was saturated.
		fmt.Fprintf(&tbl, "B5 per hop (ms; floor = minimum of %d single orders):\n%-18s %8s %8s %8s %8s %8s %8s %8s\n", len(phases["floor"]), "hop", "floor", "p50@10%", "p99@10%", "p50@50%", "p99@50%", "p50@cap", "p99@cap")
		for i, hop := range orderhop.Path {
			l10, l50, lc := b5HopLatencies(phases["10pct"], i), b5HopLatencies(phases["50pct"], i), b5HopLatencies(phases["capacity"], i)
			fmt.Fprintf(&tbl, "%-18s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", hop, b5Ms(minima[i]), b5Ms(b5Pct(l10, 50)), b5Ms(b5Pct(l10, 99)), b5Ms(b5Pct(l50, 50)), b5Ms(b5Pct(l50, 99)), b5Ms(b5Pct(lc, 50)), b5Ms(b5Pct(lc, 99)))
		}
		ec := b5EndToEnd(phases["capacity"])
		fmt.Fprintf(&tbl, "%-18s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", "end to end", b5Ms(floor), b5Ms(p50at10), b5Ms(b5Pct(e2e["10pct"], 99)), b5Ms(b5Pct(e2e["50pct"], 50)), b5Ms(p99at50), b5Ms(b5Pct(ec, 50)), b5Ms(b5Pct(ec, 99)))
		fmt.Fprintf(&tbl, "\n%s", b5CPUTable(cpu, capRes.Invoiced, cpuAfter.at.Sub(cpuBefore.at)))
		if hopCost != nil {
			fmt.Fprintf(&tbl, "\nCapacity probe, per order by stage and service database (pg_stat_statements, pg_stat_database; e2e/hopcost_bench_test.go):\n%s", b5HopCostTable(hopCost))
		}
		if wal.shapes != nil {
			fmt.Fprintf(&tbl, "\nCapacity probe, write transactions (commit records in the WAL) per order by what each wrote (e2e/walshape_bench_test.go):\n%s",
				walShapeTable(wal.shapes, dbs.names, capRes.Invoiced))
		}
		b5ProfileTops(ctx, b, profiles)
		for _, p := range profiles {
			fmt.Fprintf(&tbl, "\nCPU profile of %s during the 50%% phase (%s):\n%s", p.service, p.file, p.top)
		}
		var statements []b5Statement
		if statsOn {
			statements = b5Statements(ctx, b, server, dbs.names)
			fmt.Fprintf(&tbl, "\nPostgreSQL during the 50%% phase: the %d statements with the most execution time (pg_stat_statements):\n%s",
				min(len(statements), b5TopStatements), b5StatementTable(statements[:min(len(statements), b5TopStatements)]))
		} else {
			fmt.Fprintf(&tbl, "\nPostgreSQL statements: not measured (start with %s=on; make bench does)\n", benchkit.EnvStatStatements)
		}
		fmt.Fprint(os.Stderr, tbl.String())

		b.Logf("%s, GOMAXPROCS=%d, fsync=%s; capacity %.1f orders/s sustained (probe of %d: %.1f orders/s with fill and drain); anchor %.0f / %.0f commits/s (16 clients, before/after)",
			runtime.Version(), runtime.GOMAXPROCS(0), onOff(os.Getenv(benchkit.EnvFsync) == "on"), capacity, capN, capRes.InvoicedPerSec, anchorA, anchorB)
		b.Logf("commits per order %.1f → commit-bound limit %.1f orders/s; capacity ratio %.2f (target ≥ %.1f: %s)",
			commitsPerOrder, bound, capRatio, b5CapacityTarget, b5Met(capRatio >= b5CapacityTarget))
		b.Logf("measured floor %.1f ms (sum of per-hop minima over %d single orders; fastest single order %.1f ms)",
			b5Ms(floor), len(phases["floor"]), b5Ms(b5Pct(e2e["floor"], 0)))
		b.Logf("10%% load: p50 %.1f ms = %.2f × floor (target ≤ %.0f: %s); 50%% load: p99 %.1f ms (target < %v: %s)",
			b5Ms(p50at10), float64(p50at10)/float64(floor), b5FloorTarget, b5Met(float64(p50at10) <= b5FloorTarget*float64(floor)),
			b5Ms(p99at50), b5P99Target, b5Met(p99at50 < b5P99Target))
		b.Logf("per-hop table and CPU profile tops on stderr; profiles in %s", profDir)

		if dataDir != "" {
			b5WriteCSVs(b, dataDir, phases, all)
			if statsOn {
				b5WriteStatements(b, filepath.Join(dataDir, "b5_statements.csv"), statements)
			}
			if hopCost != nil {
				b5WriteHopCost(b, dataDir, hopCost)
				b5WriteStatements(b, filepath.Join(dataDir, "b5_probe_statements.csv"), probeStatements)
			}
		}
	}
}

// b5Sustained is the rate at which the capacity probe's orders reached
// INVOICED once the pipeline was full: invoices between the 10th and the 90th
// percentile of their INVOICED times (the databases' clock), divided by the
// time between those two. N ÷ elapsed would charge the pipeline's fill and
// drain (seconds under a burst) to its throughput, and understate it more the
// shorter the probe.
func b5Sustained(b *testing.B, orders []b5Order) float64 {
	b.Helper()
	var at []time.Time
	for _, o := range orders {
		if t := o.t[len(o.t)-1]; !t.IsZero() {
			at = append(at, t)
		}
	}
	if len(at) < 20 {
		b.Fatalf("capacity probe: %d orders with an INVOICED time, want at least 20", len(at))
	}
	slices.SortFunc(at, func(x, y time.Time) int { return x.Compare(y) })
	lo, hi := len(at)/10, len(at)*9/10
	span := at[hi].Sub(at[lo])
	if span <= 0 {
		b.Fatalf("capacity probe: the middle 80%% of invoices share one instant")
	}
	return float64(hi-lo) / span.Seconds()
}

func b5Met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func b5Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// b5Pause waits d: a settle time, not a synchronisation.
func b5Pause(d time.Duration) { <-time.After(d) }

// b5Load runs one load phase and fails the benchmark if an order was lost.
func b5Load(ctx context.Context, b *testing.B, what string, cfg loadgen.Config) *loadgen.Result {
	b.Helper()
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		b.Fatalf("%s: %v", what, err)
	}
	if res.Invoiced != res.Created || res.CreateErrors > 0 {
		b.Fatalf("%s: %d of %d invoiced, %d create errors: a benchmark that loses an effect has failed (%v)",
			what, res.Invoiced, res.Created, res.CreateErrors, res.NotInvoiced)
	}
	return res
}

// b5Order holds one order's timestamps along the path, in path order: t[0]
// created, then the end of each hop of orderhop.Path.
type b5Order struct {
	id string
	t  [10]time.Time
}

// b5DBs are connections to the services' databases.
type b5DBs struct {
	workorder, provider, billing *pgxpool.Pool
	names                        []string // the databases' names on the server
}

// serviceOf is the service of one of b5DBs.names: the stack names its
// databases <prefix>_<service>, and the figures are kept by service.
func serviceOf(db string) string { return db[strings.LastIndex(db, "_")+1:] }

func b5Open(ctx context.Context, b *testing.B, stack *localstack.Stack) *b5DBs {
	b.Helper()
	d := &b5DBs{}
	for db, p := range map[string]**pgxpool.Pool{"workorder": &d.workorder, "providersim": &d.provider, "billing": &d.billing} {
		dsn, ok := stack.DSN[db]
		if !ok {
			b.Fatalf("no %s database in the stack", db)
		}
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		*p = pool
		u, err := url.Parse(dsn)
		if err != nil {
			b.Fatal(err)
		}
		d.names = append(d.names, strings.TrimPrefix(u.Path, "/"))
	}
	return d
}

// b5Commits sums the committed transactions of the services' databases.
const b5Commits = `SELECT coalesce(sum(xact_commit), 0)::bigint FROM pg_stat_database WHERE datname = ANY($1)`

func (d *b5DBs) commits(ctx context.Context, b *testing.B) int64 {
	b.Helper()
	var n int64
	if err := d.workorder.QueryRow(ctx, b5Commits, d.names).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// The path's timestamps, read from the databases after a phase. Every one
// is written by the hop's own transaction (now() is its start, or the
// service's clock, on the same machine):
//
//	created, correlated, invoiced   work_order_transitions: the first transition, COMPLETED, INVOICED
//	accepted, started, completed    provider jobs: accepted_at, started_at, completed_at
//	published                       provider job_events.published_at of the completion
//	received                        workorder inbox.received_at of the completion
//	enqueued, issued                billing leasequeue_jobs.created_at, invoices.issued_at
//
// The provider records published_at after Pub/Sub accepted the message, so
// the inbox may store it first: the boundary of provider_publish and
// deliver is the earlier of the two. Each boundary is then taken no earlier
// than the one before it, so every hop is ≥ 0 and the hops of an order sum
// exactly to its create→INVOICED latency, the figure loadgen reports.
const (
	b5WorkOrderTimes = `
SELECT work_order_id::text, min(occurred_at),
       min(occurred_at) FILTER (WHERE to_status = 'COMPLETED'),
       min(occurred_at) FILTER (WHERE to_status = 'INVOICED')
  FROM work_order_transitions WHERE work_order_id = ANY($1::uuid[]) GROUP BY work_order_id`
	// The last completion tranche received is the one that completes the order.
	b5InboxTimes = `
SELECT correlation_key, max(received_at) FROM inbox
 WHERE correlation_key = ANY($1::text[]) AND event_type = 'lossless.events.v1.WorkOrderCompleted'
 GROUP BY correlation_key`
	b5ProviderTimes = `
SELECT j.work_order_id::text, j.accepted_at, j.started_at, j.completed_at,
       (SELECT max(e.published_at) FROM job_events e WHERE e.job_id = j.job_id AND e.kind = 'COMPLETED')
  FROM jobs j WHERE j.work_order_id = ANY($1::uuid[])`
	b5BillingTimes = `
SELECT q.unique_key, q.created_at, i.issued_at
  FROM leasequeue_jobs q JOIN invoices i ON i.job_id = q.id
 WHERE q.unique_key = ANY($1::text[])`
)

// Indexes into b5Order.t.
const (
	b5Created = iota
	b5Accepted
	b5Started
	b5Completed
	b5Published
	b5Received
	b5Correlated
	b5Enqueued
	b5Issued
	b5Invoiced
)

func (d *b5DBs) times(ctx context.Context, b testing.TB, ids []string) []b5Order {
	b.Helper()
	byID := make(map[string]*b5Order, len(ids))
	for _, id := range ids {
		byID[id] = &b5Order{id: id}
	}
	scan := func(pool *pgxpool.Pool, q string, idx ...int) {
		rows, err := pool.Query(ctx, q, ids)
		if err != nil {
			b.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			ts := make([]*time.Time, len(idx))
			dest := []any{&id}
			for i := range ts {
				dest = append(dest, &ts[i])
			}
			if err := rows.Scan(dest...); err != nil {
				b.Fatal(err)
			}
			if o := byID[id]; o != nil {
				for i, k := range idx {
					if ts[i] != nil {
						o.t[k] = *ts[i]
					}
				}
			}
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
	}
	scan(d.workorder, b5WorkOrderTimes, b5Created, b5Correlated, b5Invoiced)
	scan(d.workorder, b5InboxTimes, b5Received)
	scan(d.provider, b5ProviderTimes, b5Accepted, b5Started, b5Completed, b5Published)
	scan(d.billing, b5BillingTimes, b5Enqueued, b5Issued)
	out := make([]b5Order, 0, len(ids))
	for _, id := range ids {
		o := byID[id]
		for k, t := range o.t {
			if t.IsZero() {
				b.Fatalf("order %s: timestamp %d of the path missing from the databases", id, k)
			}
		}
		if o.t[b5Received].Before(o.t[b5Published]) {
			o.t[b5Published] = o.t[b5Received]
		}
		for k := 1; k < len(o.t); k++ {
			if o.t[k].Before(o.t[k-1]) {
				o.t[k] = o.t[k-1]
			}
		}
		out = append(out, *o)
	}
	return out
}

// b5HopLatencies are hop i's latencies (orderhop.Path[i]), sorted.
func b5HopLatencies(orders []b5Order, i int) []time.Duration {
	out := make([]time.Duration, 0, len(orders))
	for _, o := range orders {
		out = append(out, o.t[i+1].Sub(o.t[i]))
	}
	slices.Sort(out)
	return out
}

// b5EndToEnd are the orders' create→INVOICED latencies, sorted.
func b5EndToEnd(orders []b5Order) []time.Duration {
	out := make([]time.Duration, 0, len(orders))
	for _, o := range orders {
		out = append(out, o.t[b5Invoiced].Sub(o.t[b5Created]))
	}
	slices.Sort(out)
	return out
}

// b5Minima is each hop's minimum over orders.
func b5Minima(orders []b5Order) []time.Duration {
	out := make([]time.Duration, len(orderhop.Path))
	for i := range orderhop.Path {
		if lat := b5HopLatencies(orders, i); len(lat) > 0 {
			out[i] = lat[0]
		}
	}
	return out
}

// b5Pct is the nearest-rank percentile p of sorted (0: the minimum).
func b5Pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := max((len(sorted)*p+99)/100, 1)
	return sorted[i-1]
}

// b5CommitRate is the anchor: 1-row inserts, one commit each, from
// b5AnchorClients connections for d, on a fresh table of the server's own
// database after a CHECKPOINT (docs/performance.md).
func b5CommitRate(ctx context.Context, b *testing.B, serverDSN string, d time.Duration) float64 {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(serverDSN)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = b5AnchorClients
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	table := pgx.Identifier{"b5_ins1_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, v int NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	defer func() { _, _ = pool.Exec(context.WithoutCancel(ctx), "DROP TABLE "+table) }()
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		b.Fatal(err)
	}
	insert := "INSERT INTO " + table + "(v) VALUES (1)"
	var n atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range b5AnchorClients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if _, err := pool.Exec(ctx, insert); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

// b5Profile is one service's CPU profile.
type b5Profile struct {
	service, file, top string
}

// b5Profiles waits b5ProfileDelay, then fetches a CPU profile of length d
// from every service's replica 1 at once into dir/<service>.pprof. Their
// tops are read after the load (b5ProfileTops): go tool pprof takes a core
// for seconds, which stalled the pipeline it was measuring.
func b5Profiles(ctx context.Context, b *testing.B, stack *localstack.Stack, dir string, d time.Duration) []b5Profile {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Error(err)
		return nil
	}
	b5Pause(b5ProfileDelay)
	var mu sync.Mutex
	var out []b5Profile
	var wg sync.WaitGroup
	hc := &http.Client{Timeout: d + 10*time.Second}
	for _, in := range stack.Instances() {
		if in.Replica != 1 {
			continue
		}
		wg.Go(func() {
			file := filepath.Join(dir, in.Service+".pprof")
			if err := b5FetchProfile(ctx, hc, in.PprofURL+"/debug/pprof/profile?seconds="+strconv.Itoa(int(d.Seconds())), file); err != nil {
				b.Errorf("CPU profile of %s: %v", in.Service, err)
				return
			}
			mu.Lock()
			out = append(out, b5Profile{service: in.Service, file: file})
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(out, func(x, y b5Profile) int { return strings.Compare(x.service, y.service) })
	return out
}

// b5ProfileTops fills each profile's top 10 functions (go tool pprof -top).
func b5ProfileTops(ctx context.Context, b *testing.B, ps []b5Profile) {
	b.Helper()
	for i := range ps {
		top, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=10", ps[i].file).CombinedOutput()
		if err != nil {
			b.Errorf("go tool pprof -top %s: %v\n%s", ps[i].file, err, top)
			continue
		}
		ps[i].top = string(top)
	}
}

func b5FetchProfile(ctx context.Context, hc *http.Client, u, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("HTTP %d: %s (is PPROF_ADDR set?)", resp.StatusCode, body)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// b5WriteCSVs writes b5_hops.csv (phase,hop,latency_ms), b5_latency.csv
// (phase,latency_ms, create→INVOICED) and b5_rate.csv (t_s,created_per_s,
// invoiced_per_s: orders created and invoiced in each second of the run,
// from the first order's creation) into dir.
func b5WriteCSVs(b *testing.B, dir string, phases map[string][]b5Order, all []b5Order) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	names := []string{"floor", "10pct", "50pct"}
	hops := [][]string{{"phase", "hop", "latency_ms"}}
	lat := [][]string{{"phase", "latency_ms"}}
	for _, ph := range names {
		for _, o := range phases[ph] {
			for i, hop := range orderhop.Path {
				hops = append(hops, []string{ph, string(hop), b5Millis(o.t[i+1].Sub(o.t[i]))})
			}
			lat = append(lat, []string{ph, b5Millis(o.t[b5Invoiced].Sub(o.t[b5Created]))})
		}
	}
	var t0 time.Time
	for _, o := range all {
		if t0.IsZero() || o.t[b5Created].Before(t0) {
			t0 = o.t[b5Created]
		}
	}
	var created, invoiced []int
	bump := func(s *[]int, t time.Time) {
		sec := int(t.Sub(t0) / time.Second)
		for len(*s) <= sec {
			*s = append(*s, 0)
		}
		(*s)[sec]++
	}
	for _, o := range all {
		bump(&created, o.t[b5Created])
		bump(&invoiced, o.t[b5Invoiced])
	}
	rate := [][]string{{"t_s", "created_per_s", "invoiced_per_s"}}
	for s := range max(len(created), len(invoiced)) {
		c, i := 0, 0
		if s < len(created) {
			c = created[s]
		}
		if s < len(invoiced) {
			i = invoiced[s]
		}
		rate = append(rate, []string{strconv.Itoa(s), strconv.Itoa(c), strconv.Itoa(i)})
	}
	for name, rows := range map[string][][]string{"b5_hops.csv": hops, "b5_latency.csv": lat, "b5_rate.csv": rate} {
		b5WriteCSV(b, filepath.Join(dir, name), rows)
	}
}

func b5WriteCSV(b *testing.B, path string, rows [][]string) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := csv.NewWriter(f)
	if err := w.WriteAll(rows); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
}

func b5Millis(d time.Duration) string { return strconv.FormatFloat(b5Ms(d), 'f', 3, 64) }

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// envDuration and envInt read a benchmark knob; a value that does not parse
// stops the benchmark naming the variable rather than running the default.
func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: want a positive duration such as 2m", name, v)
	}
	return d
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// b5Statement is one normalised statement's share of the server's time.
type b5Statement struct {
	db, query   string
	calls, rows int64
	totalMs     float64
}

// b5ResetStatements zeroes pg_stat_statements, creating its view in the
// server's own database first; false if the module is not preloaded
// (benchkit.EnvStatStatements).
func b5ResetStatements(ctx context.Context, b *testing.B, serverDSN string) bool {
	b.Helper()
	conn, err := pgx.Connect(ctx, serverDSN)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var loaded bool
	if err := conn.QueryRow(ctx, `SELECT 'pg_stat_statements' = ANY(string_to_array(current_setting('shared_preload_libraries'), ', '))`).Scan(&loaded); err != nil {
		b.Fatal(err)
	}
	if !loaded {
		return false
	}
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		b.Fatal(err)
	}
	return true
}

// b5StatementsQuery reads the services' statements, most execution time
// first. total_exec_time includes lock and I/O waits, not the commit's WAL
// flush of an implicit transaction.
const b5StatementsQuery = `
SELECT d.datname, s.query, s.calls, s.rows, s.total_exec_time
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = ANY($1)
 ORDER BY s.total_exec_time DESC`

func b5Statements(ctx context.Context, b *testing.B, serverDSN string, dbNames []string) []b5Statement {
	b.Helper()
	conn, err := pgx.Connect(ctx, serverDSN)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	rows, err := conn.Query(ctx, b5StatementsQuery, dbNames)
	if err != nil {
		b.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (b5Statement, error) {
		var st b5Statement
		err := r.Scan(&st.db, &st.query, &st.calls, &st.rows, &st.totalMs)
		return st, err
	})
	if err != nil {
		b.Fatal(err)
	}
	for i := range out {
		out[i].db = serviceOf(out[i].db)
	}
	return out
}

func b5StatementTable(sts []b5Statement) string {
	var total float64
	for _, st := range sts {
		total += st.totalMs
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-12s %9s %9s %10s %8s  %s\n", "database", "calls", "rows", "total_ms", "mean_ms", "statement")
	for _, st := range sts {
		q := strings.Join(strings.Fields(st.query), " ")
		if len(q) > 110 {
			q = q[:110] + "…"
		}
		fmt.Fprintf(&sb, "%-12s %9d %9d %10.0f %8.3f  %s\n", st.db, st.calls, st.rows, st.totalMs, st.totalMs/float64(max(st.calls, 1)), q)
	}
	return sb.String()
}

// b5WriteStatements writes statements as CSV to file (b5_statements.csv:
// the 50 % phase's; b5_probe_statements.csv: the capacity probe's, the
// input of the per-hop cost).
func b5WriteStatements(b *testing.B, file string, sts []b5Statement) {
	b.Helper()
	recs := [][]string{{"database", "calls", "rows", "total_ms", "query"}}
	for _, st := range sts {
		recs = append(recs, []string{st.db, strconv.FormatInt(st.calls, 10), strconv.FormatInt(st.rows, 10),
			strconv.FormatFloat(st.totalMs, 'f', 3, 64), strings.Join(strings.Fields(st.query), " ")})
	}
	b5WriteCSV(b, file, recs)
}
