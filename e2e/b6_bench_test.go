package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// b6Sample is how often B6 samples the workorder database while it drains.
const b6Sample = 500 * time.Millisecond

// BenchmarkB6_SlowProvider measures hand-off throughput against a slow,
// flaky provider (benchmark B6 of docs/performance.md): provider-sim answers
// SubmitWorkOrder after a lognormal delay (p50, p99) and never answers a
// share of the calls (the caller's deadline expires; the job is recorded
// anyway). With the provider stopped, the benchmark creates a backlog of
// orders; it then starts the provider and measures the drain:
//
//   - throughput: orders reaching HANDED_OFF per second over the drain, from
//     the provider's first acceptance to the sample that saw the last
//     hand-off committed (the backlog keeps the relay saturated throughout);
//   - bound: the relay's hand-off concurrency ÷ the mean SubmitWorkOrder
//     latency the dispatcher measured (the workorder process's rpc client
//     duration histogram, timed-out calls included). The hand-off is in the
//     relay's slow mode (outbox.WithSlowDispatch), so its concurrency is
//     SlowDispatchConcurrency: that many hand-offs in flight, each worker
//     refilled as soon as its call ends;
//   - every 500 ms: workorder's connections by state, its oldest open
//     transaction and the outbox's dead tuples.
//
// Target: throughput ≥ 0.8 × bound, and no transaction older than the
// relay's lease. Every order must be handed off exactly once, with one job
// at the provider. Environment:
//
//	LOSSLESS_B6_ORDERS              backlog (default 3000)
//	LOSSLESS_B6_P50, LOSSLESS_B6_P99 accept latency (default 100ms, 1s)
//	LOSSLESS_B6_TIMEOUT             share of accepts that never answer (default 0.02)
//	LOSSLESS_B6_SLOW_DISPATCH_CONCURRENCY, LOSSLESS_B6_BATCH_SIZE, LOSSLESS_B6_DISPATCH_CONCURRENCY,
//	LOSSLESS_B6_BATCHES_IN_FLIGHT, LOSSLESS_B6_LEASE
//	                                relay settings (default: the outbox defaults; the
//	                                batch settings apply to the Pub/Sub events only)
//	LOSSLESS_B6_HANDOFF_DEADLINE    the dispatcher's deadline (default: handoff's)
//	LOSSLESS_BENCH_DATA             directory for b6_rate.csv and b6_xact_age.csv
//	LOSSLESS_PG_FSYNC=on            fsync on the stack's PostgreSQL (make bench)
func BenchmarkB6_SlowProvider(b *testing.B) {
	n := envInt(b, "LOSSLESS_B6_ORDERS", 3000)
	p50 := envDuration(b, "LOSSLESS_B6_P50", 100*time.Millisecond)
	p99 := envDuration(b, "LOSSLESS_B6_P99", time.Second)
	timeout := envFloat(b, "LOSSLESS_B6_TIMEOUT", 0.02)
	relay := outbox.Config{
		BatchSize:           envIntOr0(b, "LOSSLESS_B6_BATCH_SIZE"),
		DispatchConcurrency: envIntOr0(b, "LOSSLESS_B6_DISPATCH_CONCURRENCY"),
		BatchesInFlight:     envIntOr0(b, "LOSSLESS_B6_BATCHES_IN_FLIGHT"),

		SlowDispatchConcurrency: envIntOr0(b, "LOSSLESS_B6_SLOW_DISPATCH_CONCURRENCY"),
	}
	if os.Getenv("LOSSLESS_B6_LEASE") != "" {
		relay.LeaseDuration = envDuration(b, "LOSSLESS_B6_LEASE", 0)
	}
	var woEnv []string
	for name, v := range map[string]int{"BATCH_SIZE": relay.BatchSize, "DISPATCH_CONCURRENCY": relay.DispatchConcurrency,
		"BATCHES_IN_FLIGHT": relay.BatchesInFlight, "SLOW_DISPATCH_CONCURRENCY": relay.SlowDispatchConcurrency} {
		if v > 0 {
			woEnv = append(woEnv, "WORKORDER_OUTBOX_"+name+"="+strconv.Itoa(v))
		}
	}
	if relay.LeaseDuration > 0 {
		woEnv = append(woEnv, "WORKORDER_OUTBOX_LEASE_DURATION="+relay.LeaseDuration.String())
	}
	if d := os.Getenv("LOSSLESS_B6_HANDOFF_DEADLINE"); d != "" {
		woEnv = append(woEnv, "WORKORDER_HANDOFF_DEADLINE="+envDuration(b, "LOSSLESS_B6_HANDOFF_DEADLINE", 0).String())
	}
	// The concurrency the relay runs the hand-off with: in slow mode, up to
	// SlowDispatchConcurrency leased hand-offs in flight.
	concurrency := cmp.Or(relay.SlowDispatchConcurrency, outbox.DefaultSlowDispatchConcurrency)
	lease := cmp.Or(relay.LeaseDuration, outbox.DefaultLeaseDuration)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	binDir := buildServices(ctx, b)
	b.ResetTimer()
	for range b.N {
		b6Run(ctx, b, binDir, b6Params{n: n, p50: p50, p99: p99, timeout: timeout, woEnv: woEnv,
			concurrency: concurrency, lease: lease, describe: "slow mode (SlowDispatchConcurrency)"})
	}
}

type b6Params struct {
	n           int
	p50, p99    time.Duration
	timeout     float64
	woEnv       []string
	concurrency int
	lease       time.Duration
	describe    string
}

type b6Point struct {
	at        time.Time
	t         time.Duration
	handedOff int
	conns     map[string]int
	xactAge   time.Duration
	deadTup   int64
}

func b6Run(ctx context.Context, b *testing.B, binDir string, p b6Params) {
	b.Helper()
	ports, err := localstack.FreePorts()
	if err != nil {
		b.Fatal(err)
	}
	logw := &lockedWriter{w: new(bytes.Buffer)}
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir: binDir,
		Ports:  ports,
		Fsync:  os.Getenv(benchkit.EnvFsync) == "on",
		Log:    logw,
		ExtraEnv: map[string][]string{
			"provider-sim": {
				"PROVIDER_FAULT_ACCEPT_LATENCY_P50=" + p.p50.String(),
				"PROVIDER_FAULT_ACCEPT_LATENCY_P99=" + p.p99.String(),
				"PROVIDER_FAULT_ACCEPT_TIMEOUT=" + strconv.FormatFloat(p.timeout, 'f', -1, 64),
				"PROVIDER_FAULT_SEED=7",
				// Jobs do not complete during the run: the completion path
				// (inbox, billing) is not what B6 measures.
				"PROVIDER_EXEC_BASE=1h", "PROVIDER_EXEC_PER_POSITION=0s",
			},
			"workorder": p.woEnv,
		},
	})
	if err != nil {
		b.Fatalf("start stack: %v\n%s", err, tail(logw.String(), 20000))
	}
	defer func() {
		_ = stack.Stop(30 * time.Second)
		if b.Failed() {
			b.Logf("process logs (tail):\n%s", tail(logw.String(), 30000))
		}
	}()
	woDSN, psDSN := stack.DSN["workorder"], stack.DSN["providersim"]
	base := stack.URLs()["workorder"]

	// The backlog, created while the provider is down: the relay's circuit
	// opens and the orders wait.
	provider := stack.Process("provider-sim")
	if err := provider.Stop(30 * time.Second); err != nil {
		b.Fatal(err)
	}
	ids := b6CreateOrders(ctx, b, callerHTTP(b, stack, 30*time.Second), base, p.n)

	before := b6AcceptLatency(ctx, b, stack.MetricsURLs()["workorder"])
	if err := provider.Start(); err != nil {
		b.Fatal(err)
	}
	if err := stack.WaitReady(ctx, "provider-sim"); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	samples := b6Sampler(ctx, b, woDSN, start, p.n, 10*time.Minute)
	after := b6AcceptLatency(ctx, b, stack.MetricsURLs()["workorder"])
	last := samples[len(samples)-1]
	if last.handedOff < p.n {
		b.Fatalf("%d of %d orders handed off within 10 min", last.handedOff, p.n)
	}

	// Correctness: one HANDED_OFF transition per order, one job per order.
	b6HandedOffOnce(ctx, b, woDSN, ids)
	b6OneJobEach(ctx, b, psDSN, ids)

	// A hand-off becomes visible when its batch commits, and its
	// transition's occurred_at is the batch's claim time (now() in the claim
	// transaction): per-order timestamps say when batches started, not when
	// orders were handed off. The throughput is therefore the whole drain's:
	// from the provider's first acceptance to the first sample that saw
	// every order handed off (at most b6Sample late). The backlog keeps the
	// relay saturated all along.
	drain := last.at.Sub(b6FirstAccept(ctx, b, psDSN, ids))
	throughput := float64(p.n) / drain.Seconds()
	calls := after.count - before.count
	if calls <= 0 {
		b.Fatalf("no SubmitWorkOrder calls measured by the dispatcher (%+v → %+v)", before, after)
	}
	meanLatency := time.Duration((after.sumSeconds - before.sumSeconds) / calls * float64(time.Second))
	bound := float64(p.concurrency) / meanLatency.Seconds()
	ratio := throughput / bound

	maxConns, maxAge, maxDead := 0, time.Duration(0), int64(0)
	maxByState := map[string]int{}
	for _, s := range samples {
		total := 0
		for st, c := range s.conns {
			total += c
			maxByState[st] = max(maxByState[st], c)
		}
		maxConns = max(maxConns, total)
		maxAge = max(maxAge, s.xactAge)
		maxDead = max(maxDead, s.deadTup)
	}
	b6WriteSeries(b, samples)

	b.ReportMetric(throughput, "orders/s")
	b.ReportMetric(bound, "bound_orders/s")
	b.ReportMetric(ratio, "ratio_vs_bound")
	b.ReportMetric(float64(meanLatency.Microseconds())/1000, "mean_accept_ms")
	b.ReportMetric(float64(maxConns), "max_conns")
	b.ReportMetric(maxAge.Seconds(), "max_xact_age_s")
	b.ReportMetric(float64(maxDead), "max_dead_tup")
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	b.Logf("B6 %s GOMAXPROCS=%d: %d orders, accept p50 %v p99 %v timeouts %g; relay %s = %d in flight",
		runtime.Version(), runtime.GOMAXPROCS(0), p.n, p.p50, p.p99, p.timeout, p.describe, p.concurrency)
	b.Logf("B6 mean accept latency %v over %.0f calls (dispatcher); bound %.1f orders/s; throughput %.1f orders/s; ratio %.2f (target ≥ 0.8: %s)",
		meanLatency.Round(time.Millisecond), calls, bound, throughput, ratio, met(ratio >= 0.8))
	b.Logf("B6 max connections %d %v; max transaction age %v (lease %v: %s); max outbox dead tuples %d; drain %v",
		maxConns, maxByState, maxAge.Round(time.Millisecond), p.lease, met(maxAge <= p.lease), maxDead, last.t.Round(time.Second))
	if maxAge > p.lease {
		b.Errorf("a transaction of the workorder database was open %v, longer than the relay's lease %v", maxAge, p.lease)
	}
}

// envIntOr0 reads an optional positive integer knob; unset is 0.
func envIntOr0(b *testing.B, name string) int {
	if os.Getenv(name) == "" {
		return 0
	}
	return envInt(b, name, 0)
}

// b6CreateOrders creates n orders through the REST API, 32 at a time, and
// returns their ids.
func b6CreateOrders(ctx context.Context, b *testing.B, hc *http.Client, base string, n int) []string {
	b.Helper()
	ids := make([]string, n)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range next {
				body := fmt.Sprintf(`{"customer_id":"customer-%03d","description":"b6 order %d","positions":%d,"unit_price":{"currency_code":"EUR","minor_units":%d}}`,
					i%500, i, 1+i%10, 100+i%1000)
				id, err := b6Create(ctx, hc, base, body, uuid.NewString())
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				ids[i] = id
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		b.Fatalf("create: %v", first)
	}
	return ids
}

func b6Create(ctx context.Context, hc *http.Client, base, body, key string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/work-orders", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		WorkOrder struct {
			ID string `json:"id"`
		} `json:"workOrder"`
	}
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("create: HTTP %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("create: decode the answer: %w", err)
	}
	if out.WorkOrder.ID == "" {
		return "", errors.New("create: no id in the answer")
	}
	return out.WorkOrder.ID, nil
}

// b6Latency is the dispatcher's SubmitWorkOrder latency histogram, summed
// over its status codes.
type b6Latency struct {
	sumSeconds float64
	count      float64
}

// b6AcceptLatency scrapes the workorder process's gRPC client duration
// histogram (otelgrpc) for SubmitWorkOrder. The instrument's name and unit
// depend on the semantic-convention version otelgrpc emits (and carry the
// exposition's namespace prefix), so any *rpc_client_*duration* histogram is
// taken, its unit read from its name.
func b6AcceptLatency(ctx context.Context, b *testing.B, base string) b6Latency {
	b.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var l b6Latency
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if !strings.Contains(line, "SubmitWorkOrder") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		if !strings.Contains(name, "rpc_client_") || !strings.Contains(name, "duration") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasSuffix(name, "_count"):
			l.count += v
		case strings.HasSuffix(name, "_sum") && strings.Contains(name, "milliseconds"):
			l.sumSeconds += v / 1000
		case strings.HasSuffix(name, "_sum"):
			l.sumSeconds += v
		}
	}
	if err := s.Err(); err != nil {
		b.Fatal(err)
	}
	return l
}

// The sampler's queries. The workorder database is used by the workorder
// service alone; the sampler's own session is left out.
const (
	qB6HandedOff = `SELECT count(*) FROM work_order_transitions WHERE from_status = 'CREATED' AND to_status = 'HANDED_OFF'`
	qB6Conns     = `SELECT coalesce(state, 'unknown'), count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend' GROUP BY 1`
	qB6XactAge = `SELECT coalesce(extract(epoch FROM max(now() - xact_start)), 0) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`
	qB6DeadTup = `SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname = 'outbox'`
)

// b6Sampler samples every b6Sample until n orders are handed off or limit
// passes.
func b6Sampler(ctx context.Context, b *testing.B, dsn string, start time.Time, n int, limit time.Duration) []b6Point {
	b.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var out []b6Point
	tick := time.NewTicker(b6Sample)
	defer tick.Stop()
	for {
		now := time.Now()
		pt := b6Point{at: now, t: now.Sub(start), conns: map[string]int{}}
		if err := conn.QueryRow(ctx, qB6HandedOff).Scan(&pt.handedOff); err != nil {
			b.Fatal(err)
		}
		rows, err := conn.Query(ctx, qB6Conns)
		if err != nil {
			b.Fatal(err)
		}
		for rows.Next() {
			var st string
			var c int
			if err := rows.Scan(&st, &c); err != nil {
				b.Fatal(err)
			}
			pt.conns[st] = c
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		var age float64
		if err := conn.QueryRow(ctx, qB6XactAge).Scan(&age); err != nil {
			b.Fatal(err)
		}
		pt.xactAge = time.Duration(age * float64(time.Second))
		if err := conn.QueryRow(ctx, qB6DeadTup).Scan(&pt.deadTup); err != nil {
			b.Fatal(err)
		}
		out = append(out, pt)
		if pt.handedOff >= n || pt.t > limit {
			return out
		}
		select {
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		case <-tick.C:
		}
	}
}

// b6HandedOffOnce checks that each order was handed off exactly once (one
// CREATED → HANDED_OFF transition, one waiting point; the provider's
// "execution started" is a HANDED_OFF → HANDED_OFF history row).
func b6HandedOffOnce(ctx context.Context, b *testing.B, dsn string, ids []string) {
	b.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT work_order_id::text, count(*) FROM work_order_transitions
		WHERE from_status = 'CREATED' AND to_status = 'HANDED_OFF' AND work_order_id = ANY($1::uuid[]) GROUP BY 1`, ids)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	handedOff := 0
	for rows.Next() {
		var id string
		var c int
		if err := rows.Scan(&id, &c); err != nil {
			b.Fatal(err)
		}
		if c != 1 {
			b.Fatalf("order %s handed off %d times", id, c)
		}
		handedOff++
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	if handedOff != len(ids) {
		b.Fatalf("%d of %d orders handed off", handedOff, len(ids))
	}
	var points, orders int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT work_order_id) FROM waiting_points WHERE work_order_id = ANY($1::uuid[])`, ids).
		Scan(&points, &orders); err != nil {
		b.Fatal(err)
	}
	if points != len(ids) || orders != len(ids) {
		b.Fatalf("waiting points: %d for %d orders, want one per order (%d)", points, orders, len(ids))
	}
}

// b6FirstAccept is when the provider accepted the first of the orders.
func b6FirstAccept(ctx context.Context, b *testing.B, dsn string, ids []string) time.Time {
	b.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var at time.Time
	if err := conn.QueryRow(ctx, `SELECT min(accepted_at) FROM jobs WHERE work_order_id = ANY($1::uuid[])`, ids).Scan(&at); err != nil {
		b.Fatal(err)
	}
	return at
}

// b6OneJobEach checks that the provider holds exactly one job per order.
func b6OneJobEach(ctx context.Context, b *testing.B, dsn string, ids []string) {
	b.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var jobs, orders int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT work_order_id) FROM jobs WHERE work_order_id = ANY($1::uuid[])`, ids).
		Scan(&jobs, &orders); err != nil {
		b.Fatal(err)
	}
	if jobs != len(ids) || orders != len(ids) {
		b.Fatalf("provider jobs: %d rows for %d distinct orders, want one per order (%d)", jobs, orders, len(ids))
	}
}

// b6WriteSeries writes b6_rate.csv (hand-offs per second between samples)
// and b6_xact_age.csv (oldest transaction, connections, dead tuples) into
// LOSSLESS_BENCH_DATA when it is set.
func b6WriteSeries(b *testing.B, samples []b6Point) {
	b.Helper()
	dir := os.Getenv("LOSSLESS_BENCH_DATA")
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	var rate, age bytes.Buffer
	rate.WriteString("t_s,handoffs_per_s\n")
	age.WriteString("t_s,oldest_xact_s,connections,active,idle_in_transaction,outbox_dead_tup\n")
	for i, s := range samples {
		if i > 0 {
			prev := samples[i-1]
			fmt.Fprintf(&rate, "%.1f,%.1f\n", s.t.Seconds(), float64(s.handedOff-prev.handedOff)/(s.t-prev.t).Seconds())
		}
		total := 0
		for _, c := range s.conns {
			total += c
		}
		fmt.Fprintf(&age, "%.1f,%.3f,%d,%d,%d,%d\n", s.t.Seconds(), s.xactAge.Seconds(), total, s.conns["active"], s.conns["idle in transaction"], s.deadTup)
	}
	for name, data := range map[string][]byte{"b6_rate.csv": rate.Bytes(), "b6_xact_age.csv": age.Bytes()} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}
