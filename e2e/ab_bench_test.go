package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/devtools/loadgen"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// abSide is one side's figures of one round.
type abSide struct {
	capacity, p50, p99             float64 // orders/s; ms at 50 % load
	commits, statements, rtts, cpu float64 // per order over the capacity probe (cpu: ms, the machine's)
	writeXacts, flushes            float64 // per order over the capacity probe: commit records, WAL fsyncs (wal_bench_test.go)
	durable                        float64 // per order: the commit records of transactions that wrote data (not wake-ups)
}

// abMetrics name the figures, in report order.
var abMetrics = []struct {
	name string
	get  func(abSide) float64
}{
	{"capacity", func(s abSide) float64 { return s.capacity }},
	{"p50_50pct", func(s abSide) float64 { return s.p50 }},
	{"p99_50pct", func(s abSide) float64 { return s.p99 }},
	{"commits", func(s abSide) float64 { return s.commits }},
	{"write_xacts", func(s abSide) float64 { return s.writeXacts }},
	{"durable_xacts", func(s abSide) float64 { return s.durable }},
	{"wal_flushes", func(s abSide) float64 { return s.flushes }},
	{"statements", func(s abSide) float64 { return s.statements }},
	{"round_trips", func(s abSide) float64 { return s.rtts }},
	{"cpu_ms", func(s abSide) float64 { return s.cpu }},
}

// BenchmarkAB_Capacity compares two builds of the stack (make bench-ab):
// A, the service binaries of a base revision (LOSSLESS_AB_BASE_BIN), and B,
// the working tree's (LOSSLESS_AB_HEAD_BIN), each laid out as make build
// lays them out. Each round starts A's stack and B's, each on fresh
// databases of the one PostgreSQL server of this process (B first in odd
// rounds), and on each runs
// B5's capacity probe (closed loop; capacity = the sustained rate of its
// middle 80 %, with commits, statements, estimated round trips (see
// hopcost_bench_test.go: its rules describe the working tree's pipelining,
// so A's estimate is approximate) and the machine's CPU per order over it)
// and then
// open-loop load at 50 % of that capacity (p50 and p99 create→INVOICED). A
// side's stack is stopped before the other starts. The ratios B/A are the
// medians of the rounds' pairwise ratios, their range beside them
// (docs/performance.md: A B A B). The base must keep the working tree's
// env/config contract (internal/devtools/localstack starts both). Environment:
//
//	LOSSLESS_AB_BASE_BIN, LOSSLESS_AB_HEAD_BIN  the two binary directories (skipped without them)
//	LOSSLESS_AB_BASE_REV                        the base's revision, for the log
//	LOSSLESS_AB_ROUNDS                          rounds, each A then B (default 2)
//	LOSSLESS_AB_CAPACITY_N                      orders of each capacity probe (default 300)
//	LOSSLESS_AB_DURATION                        each 50 % load phase (default 20s)
//	LOSSLESS_BENCH_DATA                         ab_rounds.csv, one row per round and side
//	LOSSLESS_PG_FSYNC=on, LOSSLESS_PG_STAT_STATEMENTS=on as for B5 (statements and round trips need the latter)
func BenchmarkAB_Capacity(b *testing.B) {
	ctx := context.Background()
	dirs := [2]string{os.Getenv("LOSSLESS_AB_BASE_BIN"), os.Getenv("LOSSLESS_AB_HEAD_BIN")}
	if dirs[0] == "" || dirs[1] == "" {
		b.Skip("LOSSLESS_AB_BASE_BIN and LOSSLESS_AB_HEAD_BIN unset: run make bench-ab BASE=<rev>")
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "workorder")); err != nil {
			b.Fatalf("%s: not a directory of service binaries: %v", d, err)
		}
	}
	rounds := envInt(b, "LOSSLESS_AB_ROUNDS", 2)
	capN := envInt(b, "LOSSLESS_AB_CAPACITY_N", 300)
	duration := envDuration(b, "LOSSLESS_AB_DURATION", 20*time.Second)
	server := pgtest.ServerDSN(b)
	names := [2]string{"A", "B"}

	b.ResetTimer()
	for range b.N {
		sides := [2][]abSide{}
		for r := range rounds {
			sides[0], sides[1] = append(sides[0], abSide{}), append(sides[1], abSide{})
			// A first in even rounds, B first in odd ones (A B, B A, ...): a
			// drift of the machine or of the server (its databases pile up)
			// then weighs on both sides alike.
			for k := range 2 {
				i := k ^ (r % 2)
				s := abMeasure(ctx, b, dirs[i], server, capN, duration)
				sides[i][r] = s
				fmt.Fprintf(os.Stderr, "AB round %d %s: capacity %.1f orders/s, 50%% load p50 %.1f ms p99 %.1f ms; per order: %.2f commits (%.2f writing, %.2f durable, %.2f WAL flushes), %.1f statements, %.1f round trips, %.1f ms CPU\n",
					r, names[i], s.capacity, s.p50, s.p99, s.commits, s.writeXacts, s.durable, s.flushes, s.statements, s.rtts, s.cpu)
			}
		}
		var sb strings.Builder
		fmt.Fprintf(&sb, "AB: A = %s (%s), B = %s; %d rounds, probe %d orders, 50%% load for %v\n", os.Getenv("LOSSLESS_AB_BASE_REV"), dirs[0], dirs[1], rounds, capN, duration)
		fmt.Fprintf(&sb, "%-12s %10s %10s %8s %14s\n", "figure", "A median", "B median", "B/A", "B/A range")
		for _, m := range abMetrics {
			var a, bb, ratio []float64
			for r := range rounds {
				va, vb := m.get(sides[0][r]), m.get(sides[1][r])
				a, bb = append(a, va), append(bb, vb)
				if va > 0 {
					ratio = append(ratio, vb/va)
				}
			}
			med := benchkit.Median(ratio)
			lo, hi := abRange(ratio)
			b.ReportMetric(benchkit.Median(a), "A_"+m.name)
			b.ReportMetric(benchkit.Median(bb), "B_"+m.name)
			if len(ratio) > 0 {
				b.ReportMetric(med, "B/A_"+m.name)
			}
			fmt.Fprintf(&sb, "%-12s %10.2f %10.2f %8.3f %6.3f–%-6.3f\n", m.name, benchkit.Median(a), benchkit.Median(bb), med, lo, hi)
		}
		fmt.Fprint(os.Stderr, sb.String())
		b.Logf("B/A medians on stderr; capacity B/A %.3f", benchkit.Median(abRatios(sides, 0)))
		if dir := os.Getenv("LOSSLESS_BENCH_DATA"); dir != "" {
			recs := [][]string{{"round", "side", "capacity_orders_per_s", "p50_ms_50pct", "p99_ms_50pct", "commits_per_order", "write_xacts_per_order", "durable_xacts_per_order", "wal_flushes_per_order", "statements_per_order", "round_trips_per_order", "cpu_ms_per_order"}}
			for r := range rounds {
				for i := range dirs {
					s := sides[i][r]
					recs = append(recs, []string{fmt.Sprint(r), names[i], fmt.Sprintf("%.2f", s.capacity), fmt.Sprintf("%.2f", s.p50), fmt.Sprintf("%.2f", s.p99),
						fmt.Sprintf("%.3f", s.commits), fmt.Sprintf("%.3f", s.writeXacts), fmt.Sprintf("%.3f", s.durable), fmt.Sprintf("%.3f", s.flushes), fmt.Sprintf("%.3f", s.statements), fmt.Sprintf("%.3f", s.rtts), fmt.Sprintf("%.3f", s.cpu)})
				}
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatal(err)
			}
			b5WriteCSV(b, filepath.Join(dir, "ab_rounds.csv"), recs)
		}
	}
}

// abRatios are metric k's per-round ratios B/A.
func abRatios(sides [2][]abSide, k int) []float64 {
	var out []float64
	for r := range sides[0] {
		if a := abMetrics[k].get(sides[0][r]); a > 0 {
			out = append(out, abMetrics[k].get(sides[1][r])/a)
		}
	}
	return out
}

func abRange(xs []float64) (lo, hi float64) {
	for i, x := range xs {
		if i == 0 || x < lo {
			lo = x
		}
		if i == 0 || x > hi {
			hi = x
		}
	}
	return lo, hi
}

// abMeasure starts a stack from binDir, measures one side and stops it.
func abMeasure(ctx context.Context, b *testing.B, binDir, server string, capN int, duration time.Duration) abSide {
	b.Helper()
	stack, base := startBenchStackAt(b, binDir, "ab_", false, nil)
	defer func() { _ = stack.Stop(30 * time.Second) }()
	dbs := b5Open(ctx, b, stack)
	// Warm the stack (connections, prepared statements) off the clock.
	b5Load(ctx, b, "warm-up", loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second), BaseURL: base, Count: 10, Concurrency: 4, MaxPositions: 10, Wait: time.Minute, Seed: 3})

	b5Pause(b5StatsSettle) // the warm-up's commits flushed before the reading
	statsOn := b5ResetStatements(ctx, b, server)
	commitsBefore := b7Commits(ctx, b, server, dbs.names)
	walBefore := walMarkNow(ctx, b, server)
	cpuBefore := b5CPUNow(ctx, b, stack, dbs.workorder)
	capRes := b5Load(ctx, b, "capacity probe", loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second), BaseURL: base, Count: capN, Concurrency: 64, MaxPositions: 10, Wait: 5 * time.Minute, Seed: 7})
	cpu := b5CPUDelta(cpuBefore, b5CPUNow(ctx, b, stack, dbs.workorder))
	var s abSide
	b5Pause(b5StatsSettle) // statements and commits over the same span (B5)
	if statsOn {
		for _, r := range b5HopCosts(b5Statements(ctx, b, server, dbs.names), nil, capRes.Invoiced) {
			if r.stage == stageTotal {
				s.statements += r.statements
				s.rtts += r.rtts
			}
		}
	}
	for db, n := range b7Commits(ctx, b, server, dbs.names) {
		s.commits += float64(n-commitsBefore[db]) / float64(capRes.Invoiced)
	}
	wal := walSince(ctx, b, server, walBefore)
	s.writeXacts, s.flushes = perOrder(wal.writeXacts, capRes.Invoiced), float64(wal.flushes)/float64(capRes.Invoiced)
	s.durable = perOrder(wal.durable, capRes.Invoiced)
	s.cpu = b5Ms(cpu[b5CPUMachine]) / float64(capRes.Invoiced)
	s.capacity = b5Sustained(b, dbs.times(ctx, b, capRes.OrderIDs))

	res := b5Load(ctx, b, "50% load", loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second), BaseURL: base,
		Rate: s.capacity * 0.5, Duration: duration, Concurrency: 64, MaxPositions: 10, Wait: 5 * time.Minute, Seed: 11})
	e2e := b5EndToEnd(dbs.times(ctx, b, res.OrderIDs))
	s.p50, s.p99 = b5Ms(b5Pct(e2e, 50)), b5Ms(b5Pct(e2e, 99))
	return s
}
