package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/internal/devtools/loadgen"
	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/internal/testkit/netfault"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// Definitions of benchmark B7.
const (
	// b7LowLoad is the low-load run's offered rate, as a fraction of the
	// capacity measured at the same round-trip time (B5's 10 %).
	b7LowLoad = 0.1
	// b7MinLowOrders stretches a low-load run that would create fewer
	// orders (a low capacity at a long round trip).
	b7MinLowOrders = 20
	// b7Direct is the service whose database link stays direct: provider-sim
	// stands for the provider, whose database is not ours to move.
	b7Direct = "provider-sim"
	// Targets, against the run at no added round trip.
	b7TargetRTT      = 5 * time.Millisecond
	b7P50Target      = 4.0 // p50 at 5 ms ÷ p50 at 0 ms, below
	b7CapacityTarget = 0.5 // capacity at 5 ms ÷ capacity at 0 ms, at least
)

// b7HistoryRead matches the work-order API's history read (qHistory of
// services/workorder/internal/orders, as pg_stat_statements normalises
// it), which the order's path never sends. The load generator's status
// polls (one GetWorkOrder per waiting order every 200 ms) read the order
// with qGet, which the hand-off's pre-check shares: they are counted.
const b7HistoryRead = `%FROM work_order_transitions%WHERE work_order_id = $1%ORDER BY id%`

// BenchmarkB7_Distance measures what distance to PostgreSQL costs
// (benchmark B7 of docs/performance.md). One stack runs with every replica's
// PostgreSQL connection, provider-sim's excepted (b7Direct), through an
// internal/testkit/netfault link; for each added round-trip time (RTT) in turn the
// links are degraded by half of it each way (netfault's Degradation.Latency
// is one way, per direction), and the benchmark runs
//
//   - a closed-loop capacity probe (B5's: the sustained rate of the middle
//     80 % of its invoices);
//   - a low-load run: open loop at 10 % of that capacity, whose
//     create→INVOICED p50 and p99, and per-hop p50 (internal/orderhop, from
//     the databases' timestamps as in B5), it reports;
//   - over the probe, per service database: statements per order
//     (pg_stat_statements calls, BEGIN and COMMIT included, the load
//     generator's status reads left out; with LOSSLESS_PG_STAT_STATEMENTS=on)
//     and transactions per order (pg_stat_database xact_commit), polls of
//     the pipeline's workers included, as B5 counts them.
//
// The 0 ms baseline (the links in place, no delay) runs first and again
// last, and its figures are the two runs' means. Against it, each RTT's p50
// and capacity ratio, and the round trips the critical path waits on: (p50 at
// the RTT − p50 at 0) ÷ the RTT, end to end and, at the longest RTT, per hop.
// Target: at 5 ms, p50 < 4 × and capacity ≥ 0.5 × their values at 0 ms.
// Environment:
//
//	LOSSLESS_B7_RTTS        added round-trip times, comma-separated (default 0ms,1ms,5ms,20ms)
//	LOSSLESS_B7_CAPACITY_N  orders of each closed-loop capacity probe (default 300)
//	LOSSLESS_B7_DURATION    each low-load run (default 30s; stretched to create at least 20 orders)
//	LOSSLESS_BENCH_DATA     directory for b7_capacity.csv, b7_latency.csv, b7_hops.csv, b7_round_trips.csv
//	LOSSLESS_PG_FSYNC=on, LOSSLESS_PG_STAT_STATEMENTS=on  as for B5 (make bench)
func BenchmarkB7_Distance(b *testing.B) {
	ctx := context.Background()
	rtts := b7RTTs(b)
	capN := envInt(b, "LOSSLESS_B7_CAPACITY_N", 300)
	duration := envDuration(b, "LOSSLESS_B7_DURATION", 30*time.Second)

	h, err := netfault.New(netfault.Config{MaxFault: time.Hour, Loss: netfault.LossProxy})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = h.Close() })
	stack, base := startBenchStackLinked(b, "b7_", false, func(instance, target, addr string) (string, error) {
		if target != localstack.LinkPostgres || strings.HasPrefix(instance, b7Direct+"-") {
			return addr, nil
		}
		return h.Route(instance, target, addr)
	})
	links := h.Links(func(name string) bool { return strings.HasSuffix(name, "->"+localstack.LinkPostgres) })
	if len(links) == 0 {
		b.Fatal("no PostgreSQL link made: localstack.Config.Links was not called")
	}
	var linkNames []string
	for _, l := range links {
		linkNames = append(linkNames, l.Name())
	}
	dbs := b5Open(ctx, b, stack)
	server := pgtest.ServerDSN(b)

	b.ResetTimer()
	for range b.N {
		var points []b7Point
		for _, rtt := range rtts {
			points = append(points, b7Measure(ctx, b, h, links, stack, base, dbs, server, rtt, capN, duration))
		}
		// The baseline again at the end (A B C D A): the machine and the
		// tables drift during a run, and the RTTs run in one order.
		var again *b7Point
		if slices.Contains(rtts, 0) {
			p := b7Measure(ctx, b, h, links, stack, base, dbs, server, 0, capN, duration)
			again = &p
		}
		b7Report(b, points, again, linkNames)
	}
}

// b7Point is what one added round-trip time measured.
type b7Point struct {
	rtt                 time.Duration
	capacity, probeRate float64
	p50, p99            time.Duration
	hopP50              []time.Duration    // by orderhop.Path
	capHopP50           []time.Duration    // by orderhop.Path, over the capacity probe: where its orders queued
	statements          map[string]float64 // per order, by service; nil without pg_stat_statements
	commits             map[string]float64 // per order, by service
	lowOrders           int
}

func (p b7Point) label() string { return b7Label(p.rtt) }

// b7Label names an RTT in metric units and CSVs: "5ms", "0.5ms".
func b7Label(rtt time.Duration) string {
	return strconv.FormatFloat(float64(rtt)/float64(time.Millisecond), 'f', -1, 64) + "ms"
}

func b7RTTs(b *testing.B) []time.Duration {
	const name = "LOSSLESS_B7_RTTS"
	v := os.Getenv(name)
	if v == "" {
		return []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond}
	}
	var out []time.Duration
	for f := range strings.SplitSeq(v, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d < 0 || d > time.Second || slices.Contains(out, d) {
			b.Fatalf("%s=%q: want distinct durations from 0 to 1s, comma-separated, such as 0ms,5ms", name, v)
		}
		out = append(out, d)
	}
	return out
}

// b7Measure degrades the links by rtt, runs the probe and the low-load run,
// and heals them.
func b7Measure(ctx context.Context, b *testing.B, h *netfault.Harness, links []*netfault.Link, stack *localstack.Stack,
	base string, dbs *b5DBs, server string, rtt time.Duration, capN int, duration time.Duration) b7Point {
	b.Helper()
	if rtt > 0 {
		f, err := h.Degrade("rtt "+b7Label(rtt), netfault.Degradation{Latency: rtt / 2}, links...)
		if err != nil {
			b.Fatal(err)
		}
		defer func() {
			if err := f.Heal(); err != nil {
				b.Error(err)
			}
		}()
	}
	p := b7Point{rtt: rtt}
	what := "rtt " + b7Label(rtt)

	b5Pause(b5StatsSettle) // the commits before flushed (b5StatsSettle)
	statsOn := b5ResetStatements(ctx, b, server)
	before := b7Commits(ctx, b, server, dbs.names)
	capRes := b5Load(ctx, b, what+": capacity probe", loadgen.Config{HTTP: callerHTTP(b, stack, 30*time.Second), BaseURL: base,
		Count: capN, Concurrency: 64, MaxPositions: 10, Wait: 10 * time.Minute, Seed: 7})
	b5Pause(b5StatsSettle)
	if statsOn {
		p.statements = b7PerOrder(b7Statements(ctx, b, server, dbs.names), nil, capRes.Invoiced)
	}
	p.commits = b7PerOrder(b7Commits(ctx, b, server, dbs.names), before, capRes.Invoiced)
	probed := dbs.times(ctx, b, capRes.OrderIDs)
	p.capacity = b5Sustained(b, probed)
	p.probeRate = capRes.InvoicedPerSec
	for i := range orderhop.Path {
		p.capHopP50 = append(p.capHopP50, b5Pct(b5HopLatencies(probed, i), 50))
	}

	rate := b7LowLoad * p.capacity
	d := max(duration, time.Duration(float64(b7MinLowOrders)/rate*float64(time.Second)))
	low := b5Load(ctx, b, what+": low load", loadgen.Config{HTTP: callerHTTP(b, stack, 30*time.Second), BaseURL: base,
		Rate: rate, Duration: d, Concurrency: 64, MaxPositions: 10, Wait: 10 * time.Minute, Seed: 11})
	orders := dbs.times(ctx, b, low.OrderIDs)
	p.lowOrders = len(orders)
	e2e := b5EndToEnd(orders)
	p.p50, p.p99 = b5Pct(e2e, 50), b5Pct(e2e, 99)
	for i := range orderhop.Path {
		p.hopP50 = append(p.hopP50, b5Pct(b5HopLatencies(orders, i), 50))
	}
	fmt.Fprintf(os.Stderr, "B7 rtt %s: capacity %.1f orders/s, low load %.1f orders/s × %v: p50 %.1f ms p99 %.1f ms\n",
		b7Label(rtt), p.capacity, rate, d.Round(time.Second), b5Ms(p.p50), b5Ms(p.p99))
	return p
}

// b7CommitsQuery reads the committed transactions of each database; it runs
// in the server's own database, so it counts in none of the services'.
const b7CommitsQuery = `SELECT datname, xact_commit FROM pg_stat_database WHERE datname = ANY($1)`

// b7StatementsQuery sums each service database's statement executions.
const b7StatementsQuery = `
SELECT d.datname, sum(s.calls)::bigint
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = ANY($1) AND s.query NOT LIKE $2
 GROUP BY d.datname`

func b7Commits(ctx context.Context, b *testing.B, server string, dbNames []string) map[string]int64 {
	b.Helper()
	return b7ByService(ctx, b, server, b7CommitsQuery, dbNames)
}

func b7Statements(ctx context.Context, b *testing.B, server string, dbNames []string) map[string]int64 {
	b.Helper()
	return b7ByService(ctx, b, server, b7StatementsQuery, dbNames, b7HistoryRead)
}

// b7ByService runs a (datname, count) query on the server's own database
// and keys the counts by service (the databases are <prefix><service>).
func b7ByService(ctx context.Context, b *testing.B, server, query string, dbNames []string, args ...any) map[string]int64 {
	b.Helper()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	rows, err := conn.Query(ctx, query, append([]any{dbNames}, args...)...)
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]int64{}
	var db string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&db, &n}, func() error {
		out[serviceOf(db)] = n
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	return out
}

// b7PerOrder is (after − before) ÷ orders per service.
func b7PerOrder(after, before map[string]int64, orders int) map[string]float64 {
	out := map[string]float64{}
	for svc, n := range after {
		out[svc] = float64(n-before[svc]) / float64(max(orders, 1))
	}
	return out
}

// b7Mean is the baseline the ratios use: the mean of the two 0 ms runs'
// capacities and percentiles. The statements and transactions per order
// stay the first run's.
func b7Mean(first, again b7Point) b7Point {
	m := first
	m.capacity = (first.capacity + again.capacity) / 2
	m.probeRate = (first.probeRate + again.probeRate) / 2
	m.p50, m.p99 = (first.p50+again.p50)/2, (first.p99+again.p99)/2
	m.hopP50 = make([]time.Duration, len(first.hopP50))
	for i := range m.hopP50 {
		m.hopP50[i] = (first.hopP50[i] + again.hopP50[i]) / 2
	}
	m.lowOrders = first.lowOrders + again.lowOrders
	return m
}

// b7Report reports the metrics, the table (stderr), the log lines and the
// CSVs of every RTT's point; again is the closing 0 ms run (nil without
// one), which points' 0 ms point becomes the mean with.
func b7Report(b *testing.B, points []b7Point, again *b7Point, linkNames []string) {
	b.Helper()
	var zero, target *b7Point
	var first b7Point
	for i := range points {
		switch points[i].rtt {
		case 0:
			first = points[i]
			if again != nil {
				points[i] = b7Mean(points[i], *again)
			}
			zero = &points[i]
		case b7TargetRTT:
			target = &points[i]
		}
	}
	if again != nil {
		b.ReportMetric(first.capacity, "capacity_orders/s_0ms_first")
		b.ReportMetric(again.capacity, "capacity_orders/s_0ms_last")
		b.ReportMetric(b5Ms(first.p50), "p50_ms_0ms_first")
		b.ReportMetric(b5Ms(again.p50), "p50_ms_0ms_last")
	}
	longest := points[0]
	for _, p := range points {
		if p.rtt > longest.rtt {
			longest = p
		}
	}
	services := b7Services(points)
	for _, p := range points {
		l := p.label()
		b.ReportMetric(p.capacity, "capacity_orders/s_"+l)
		b.ReportMetric(p.probeRate, "probe_orders/s_"+l)
		b.ReportMetric(b5Ms(p.p50), "p50_ms_"+l)
		b.ReportMetric(b5Ms(p.p99), "p99_ms_"+l)
		for _, svc := range services {
			if p.statements != nil {
				b.ReportMetric(p.statements[svc], "statements/order_"+svc+"_"+l)
			}
			b.ReportMetric(p.commits[svc], "commits/order_"+svc+"_"+l)
		}
		if zero != nil && p.rtt > 0 {
			b.ReportMetric(float64(p.p50)/float64(zero.p50), "p50_"+l+"/p50_0ms")
			b.ReportMetric(p.capacity/zero.capacity, "capacity_"+l+"/capacity_0ms")
			b.ReportMetric(float64(p.p50-zero.p50)/float64(p.rtt), "path_rtts_"+l)
		}
	}
	if zero != nil && longest.rtt > 0 {
		for i, hop := range orderhop.Path {
			b.ReportMetric(float64(longest.hopP50[i]-zero.hopP50[i])/float64(longest.rtt), "path_rtts_"+string(hop)+"_"+longest.label())
		}
	}

	var tbl strings.Builder
	fmt.Fprintf(&tbl, "B7 per added RTT (capacity: closed-loop probe; latency: open loop at %.0f %% of that capacity; 0ms: the mean of the first and last run):\n", 100*b7LowLoad)
	fmt.Fprintf(&tbl, "%-8s %10s %10s %9s %9s %7s", "rtt", "orders/s", "probe/s", "p50_ms", "p99_ms", "n")
	for _, svc := range services {
		fmt.Fprintf(&tbl, " %14s %14s", "stmts/o "+svc, "xacts/o "+svc)
	}
	tbl.WriteString("\n")
	for _, p := range points {
		fmt.Fprintf(&tbl, "%-8s %10.1f %10.1f %9.1f %9.1f %7d", p.label(), p.capacity, p.probeRate, b5Ms(p.p50), b5Ms(p.p99), p.lowOrders)
		for _, svc := range services {
			st := "—"
			if p.statements != nil {
				st = strconv.FormatFloat(p.statements[svc], 'f', 1, 64)
			}
			fmt.Fprintf(&tbl, " %14s %14.1f", st, p.commits[svc])
		}
		tbl.WriteString("\n")
	}
	// The capacity probes' hops say which stage held the orders back at
	// each distance: the one whose p50 grows most is the one that binds.
	for _, t := range []struct {
		what string
		hops func(b7Point) []time.Duration
	}{
		{"the low-load runs", func(p b7Point) []time.Duration { return p.hopP50 }},
		{"the capacity probes (the 0 ms one: the first run's)", func(p b7Point) []time.Duration { return p.capHopP50 }},
	} {
		fmt.Fprintf(&tbl, "\nper-hop p50 (ms) of %s:\n%-18s", t.what, "hop")
		for _, p := range points {
			fmt.Fprintf(&tbl, " %8s", p.label())
		}
		tbl.WriteString("\n")
		for i, hop := range orderhop.Path {
			fmt.Fprintf(&tbl, "%-18s", hop)
			for _, p := range points {
				fmt.Fprintf(&tbl, " %8.1f", b5Ms(t.hops(p)[i]))
			}
			tbl.WriteString("\n")
		}
	}
	fmt.Fprint(os.Stderr, tbl.String())

	b.Logf("B7 go=%s GOMAXPROCS=%d fsync=%s: links delayed %s (half the RTT each way; %s direct)",
		runtime.Version(), runtime.GOMAXPROCS(0), onOff(os.Getenv(benchkit.EnvFsync) == "on"), strings.Join(linkNames, ", "), b7Direct)
	if again != nil {
		b.Logf("rtt 0ms, first and last run: capacity %.1f and %.1f orders/s, p50 %.1f and %.1f ms; the 0ms figures are their means",
			first.capacity, again.capacity, b5Ms(first.p50), b5Ms(again.p50))
	}
	for _, p := range points {
		b.Logf("rtt %s: capacity %.1f orders/s; p50 %.1f ms, p99 %.1f ms at 10 %% of it (%d orders)",
			p.label(), p.capacity, b5Ms(p.p50), b5Ms(p.p99), p.lowOrders)
	}
	if zero != nil && target != nil {
		p50r, capr := float64(target.p50)/float64(zero.p50), target.capacity/zero.capacity
		b.Logf("at %s: p50 %.2f × its value at 0 ms (target < %.0f: %s); capacity %.2f × (target ≥ %.1f: %s)",
			target.label(), p50r, b7P50Target, b5Met(p50r < b7P50Target), capr, b7CapacityTarget, b5Met(capr >= b7CapacityTarget))
	} else {
		b.Logf("targets not evaluated: LOSSLESS_B7_RTTS lacks 0ms or %s", b7Label(b7TargetRTT))
	}
	if points[0].statements == nil {
		b.Logf("statements per order: not measured (start with %s=on; make bench does)", benchkit.EnvStatStatements)
	}
	if dir := os.Getenv("LOSSLESS_BENCH_DATA"); dir != "" {
		b7WriteCSVs(b, dir, points, services)
	}
}

// onOff writes a setting as the benchmarks log it (fsync=on), which bench/report reads.
func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// b7Services are the services counted in any point, sorted.
func b7Services(points []b7Point) []string {
	var out []string
	for _, p := range points {
		for svc := range p.commits {
			if !slices.Contains(out, svc) {
				out = append(out, svc)
			}
		}
	}
	slices.Sort(out)
	return out
}

// b7WriteCSVs writes b7_capacity.csv (rtt_ms,capacity_orders_per_s,
// probe_orders_per_s), b7_latency.csv (rtt_ms,p50_ms,p99_ms), b7_hops.csv
// (rtt_ms,hop,p50_ms) and b7_round_trips.csv (rtt_ms,service,
// statements_per_order,commits_per_order; the statements column only with
// pg_stat_statements) into dir: each a series over the added RTT.
func b7WriteCSVs(b *testing.B, dir string, points []b7Point, services []string) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	ms := func(rtt time.Duration) string {
		return strconv.FormatFloat(float64(rtt)/float64(time.Millisecond), 'f', -1, 64)
	}
	f1 := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	capacity := [][]string{{"rtt_ms", "capacity_orders_per_s", "probe_orders_per_s"}}
	latency := [][]string{{"rtt_ms", "p50_ms", "p99_ms"}}
	hops := [][]string{{"rtt_ms", "hop", "p50_ms"}}
	withStatements := points[0].statements != nil
	trips := [][]string{{"rtt_ms", "service", "commits_per_order"}}
	if withStatements {
		trips[0] = []string{"rtt_ms", "service", "statements_per_order", "commits_per_order"}
	}
	for _, p := range points {
		capacity = append(capacity, []string{ms(p.rtt), f1(p.capacity), f1(p.probeRate)})
		latency = append(latency, []string{ms(p.rtt), b5Millis(p.p50), b5Millis(p.p99)})
		for i, hop := range orderhop.Path {
			hops = append(hops, []string{ms(p.rtt), string(hop), b5Millis(p.hopP50[i])})
		}
		for _, svc := range services {
			row := []string{ms(p.rtt), svc}
			if withStatements {
				row = append(row, f1(p.statements[svc]))
			}
			trips = append(trips, append(row, f1(p.commits[svc])))
		}
	}
	for name, rows := range map[string][][]string{"b7_capacity.csv": capacity, "b7_latency.csv": latency,
		"b7_hops.csv": hops, "b7_round_trips.csv": trips} {
		b5WriteCSV(b, filepath.Join(dir, name), rows)
	}
}
