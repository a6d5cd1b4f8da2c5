package main

// Benchmark is one benchmark id of docs/performance.md: where its Go
// benchmark lives and what it is measured against.
type Benchmark struct {
	ID string
	// Package is the import path of the benchmark's package, relative to the
	// module (the main module's, or a nested module's full path).
	Package string
	// Func is the top-level benchmark function.
	Func   string
	Anchor string
}

// Target is one checked figure: the metric a benchmark reports with
// b.ReportMetric (its unit), compared with a threshold.
type Target struct {
	ID string
	// Unit of the metric. A trailing "*" matches every unit with that
	// prefix (one check per service, per fault...).
	Unit      string
	Cmp       Cmp
	Threshold float64
	// Sub restricts the check to the sub-benchmarks whose name contains it
	// ("" for every result line of the benchmark).
	Sub         string
	Description string
}

// Cmp is a comparison of a measured value with a threshold.
type Cmp string

// The comparisons the targets use.
const (
	AtLeast Cmp = ">="
	AtMost  Cmp = "<="
	Below   Cmp = "<"
)

func (c Cmp) holds(v, threshold float64) bool {
	switch c {
	case AtLeast:
		return v >= threshold
	case AtMost:
		return v <= threshold
	case Below:
		return v < threshold
	}
	return false
}

func (c Cmp) symbol() string {
	switch c {
	case AtLeast:
		return "≥"
	case AtMost:
		return "≤"
	}
	return string(c)
}

// benchmarks are the ids of docs/performance.md, in its order. A benchmark
// whose function does not exist yet is still listed: the report shows it as
// not run.
var benchmarks = []Benchmark{
	{"B1", "bench/outbox", "BenchmarkB1_RelayDrain", "keyset claim (internal/testkit/benchkit), same database, A B A B"},
	{"B1p", "bench/outboxpubsub", "BenchmarkB1p_RelayToPubSub", "min(keyset claim, publish-only ceiling on the same emulator)"},
	{"B1w", "bench/watermill-compare", "BenchmarkB1w_RelayVsWatermill", "watermill-sql's forwarder at its best adapter (default, queue) per backlog size, on the same server"},
	{"B2", "bench/outbox", "BenchmarkB2_SustainedDrain", "itself: the rate of its first 30 s"},
	{"B3", "bench/river-compare", "BenchmarkB3_LeaseQueueVsRiver", "River v0.51.2 at its best worker count (100, 1000, 2000) on the same server: a burn-down, then a fixed-rate producer"},
	{"B4", "services/workorder/internal/receiver", "BenchmarkB4_ReceiverIngest", "inbox-style insert, 4 clients, same server, A B A B"},
	{"B5", "e2e", "BenchmarkB5_EndToEndLatency", "measured capacity bound and latency floor, same run"},
	{"B6", "e2e", "BenchmarkB6_SlowProvider", "the hand-off's concurrency ÷ the provider's mean accept latency"},
	{"B7", "e2e", "BenchmarkB7_Distance", "the same stack with no added round trip (0 ms), run first and last in the same run"},
	{"M1", "e2e", "BenchmarkM1_Memory", "the RSS of the same processes at 50 % load"},
	{"R1", "e2e", "BenchmarkR1_Recovery", "the restarted dependency's readiness"},
}

// targets are the checked figures of docs/performance.md. A benchmark id
// without a target row reports its metrics but is never "met".
var targets = []Target{
	{"B1", "relay1/keyset", AtLeast, 0.7, "", "1 relay vs the keyset claim"},
	{"B1", "relay2/keyset", AtLeast, 0.7, "", "2 relays vs the keyset claim"},
	{"B1p", "relay/min_anchor", AtLeast, 0.7, "", "relay to Pub/Sub vs min(keyset, ceiling)"},
	{"B1w", "ratio_vs_watermill", AtLeast, 1.5, "", "our relay vs watermill's best adapter, the lowest over the sizes"},
	{"B2", "last/first", AtLeast, 0.8, "", "last 30 s of the sustained phase vs its first"},
	{"B2", "held/first", AtLeast, 0.5, "", "while vacuum is held back"},
	{"B2", "after/first", AtLeast, 0.8, "", "after the release"},
	{"B3", "ratio_vs_river", AtLeast, 1.2, "", "burn-down, our best vs River's best worker count"},
	{"B3", "continuous_ratio_vs_river", AtLeast, 1.2, "", "River's p50 completion latency ÷ ours at a fixed rate, best settings"},
	{"B4", "ratio", AtLeast, 1.0, "", "ingest vs the inbox-style insert"},
	{"B5", "capacity/commit_bound", AtLeast, 0.5, "", "capacity vs the commit-bound limit"},
	{"B5", "p50/floor_10pct", AtMost, 2, "", "p50 at 10 % load vs the measured floor"},
	{"B5", "p99_ms_50pct", Below, 1000, "", "p99 at 50 % load"},
	{"B5", "commits/order_system", AtMost, 12, "", "commits per order over the capacity probe (pg_stat_database, every service database), the load generator's and the benchmark's own transactions left out (e2e/hopcost_bench_test.go)"},
	{"B5", "durable_xacts/order", AtMost, 8, "", "durable commits per order over the capacity probe: commit records in the WAL (pg_waldump) of transactions that wrote data, server-wide, the wake-ups (a NOTIFY's own transaction, synchronous_commit off) apart; one per durable step (e2e/wal_bench_test.go, e2e/walshape_bench_test.go)"},
	{"B5", "cpu_ms/order_machine", AtMost, 20, "", "the machine's CPU time per order over the capacity probe, ms"},
	{"B6", "ratio_vs_bound", AtLeast, 0.8, "", "hand-off rate vs its concurrency bound"},
	{"B7", "p50_5ms/p50_0ms", Below, 4, "", "p50 create→invoiced at 5 ms added round trip vs at 0 ms"},
	{"B7", "capacity_5ms/capacity_0ms", AtLeast, 0.5, "", "capacity at 5 ms added round trip vs at 0 ms"},
	{"M1", "rss_mb_steady_*", AtMost, 150, "", "RSS at 50 % load, MB"},
	{"M1", "rss_mb_burst_*", AtMost, 150, "", "RSS during the 10 × burst and its drain, MB"},
	{"M1", "burst/steady_*", AtMost, 2, "", "bounded: burst max vs steady max"},
	{"M1", "end/steady_*", AtMost, 1.5, "", "bounded: after the drain vs steady max"},
	{"R1", "recovery_s_workorder", AtMost, 5, "", "back to 90 % after workorder's readiness, s"},
	{"R1", "recovery_s_provider", AtMost, 5, "", "back to 90 % after provider-sim's readiness, s"},
	{"R1", "recovery_s_billing", AtMost, 5, "", "back to 90 % after billing's readiness, s"},
	{"R1", "recovery_s_postgres", AtMost, 5, "", "back to 90 % after PostgreSQL accepts connections, s"},
	{"R1", "p99_affected_s_*", Below, 30, "publishThenCrash=0.2", "p99 of affected orders with publishThenCrash 20 %, s"},
}
