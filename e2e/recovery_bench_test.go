package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/internal/devtools/loadgen"
	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
)

// Definitions of benchmark R1.
const (
	// r1Window is the shortest throughput window: orders reaching INVOICED
	// in [s, s+w), from the transitions' occurred_at. At a low offered rate
	// a 1 s window holds one or two orders, and counting noise alone keeps
	// three in a row from reaching 90 %, so the window grows to hold
	// r1WindowOrders at the offered rate. The publishThenCrash pass (about
	// 2 orders/s, a provider restart every few seconds, each holding orders
	// back 1-4 s) needs 20: with 10, a run at 2.2 orders/s found its
	// fault-free point "not back" after 15 s.
	r1Window       = time.Second
	r1WindowOrders = 20
	// r1Step is how far candidate windows slide.
	r1Step = 100 * time.Millisecond
	// r1Consecutive windows, back to back, must each reach r1Back × rate for
	// throughput to count as back; the first window's start is the recovery
	// point.
	r1Consecutive = 3
	r1Back        = 0.9
	// r1Margin extends a fault's window of affected orders past readiness:
	// an order whose creation began in [kill, ready+r1Margin] is affected.
	r1Margin = 2 * time.Second
	// r1LoadShare of the capacity measured under the same faults is the
	// offered rate unless LOSSLESS_R1_RATE sets one.
	r1LoadShare = 0.4
)

// r1Fault is one injected fault and what was observed about it.
type r1Fault struct {
	key      string // metric suffix
	what     string
	injected time.Time // SIGKILL sent, or PostgreSQL crashed
	ready    time.Time // /readyz 200 again, or PostgreSQL accepting connections
}

// BenchmarkR1_Recovery measures how fast the system returns to its steady
// throughput after each fault, under a steady open-loop load with the
// provider's publishThenCrash fault off, then at 20 % (benchmark R1), each
// pass on a stack of its own: SIGKILL workorder, SIGKILL provider-sim,
// SIGKILL billing (each restarted by the stack's supervisor), then a
// crash-restart of PostgreSQL, each once, with a steady phase between them. Per fault it reports the time from the
// dependency's readiness to invoiced-per-second throughput back at 90 % of
// the offered rate, and the p99 create→invoiced latency of the orders
// created during the fault, counted from the start of their creation (a
// create answered 503 is retried with its Idempotency-Key). Environment:
//
//	LOSSLESS_R1_RATE                 offered orders/s (default 0: 40 % of the pass's capacity probe, or of its restart bound when lower: r1RestartBound)
//	LOSSLESS_R1_CAPACITY_N           orders of the closed-loop capacity probe under the same faults (default 120)
//	LOSSLESS_R1_WARMUP               steady phase before the first fault (default 20s)
//	LOSSLESS_R1_PERIOD               time from one fault to the next, and after the last (default 25s)
//	LOSSLESS_R1_PUBLISH_THEN_CRASH   publishThenCrash rate of the second pass (default 0.2; 0 skips it)
//	LOSSLESS_R1_LOGS                 a directory to write each pass's process logs to (default: none)
//	LOSSLESS_PG_FSYNC=on             fsync on the stack's PostgreSQL (make bench)
func BenchmarkR1_Recovery(b *testing.B) {
	cfg := r1Config{
		rate:   envFloat(b, "LOSSLESS_R1_RATE", 0),
		capN:   envInt(b, "LOSSLESS_R1_CAPACITY_N", 120),
		warmup: envDuration(b, "LOSSLESS_R1_WARMUP", 20*time.Second),
		period: envDuration(b, "LOSSLESS_R1_PERIOD", 25*time.Second),
	}
	ptc := envFloat(b, "LOSSLESS_R1_PUBLISH_THEN_CRASH", 0.2)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	binDir := buildServices(ctx, b)
	// Without provider faults the throughput is steady enough for the
	// recovery criterion to measure the injected fault; with publishThenCrash
	// the provider also restarts on its own every second or two, which the
	// baseline row shows. One sub-benchmark each: each keeps its own table
	// (a benchmark's log is cut at 10 lines).
	b.Run("publishThenCrash=0", func(b *testing.B) {
		for range b.N {
			r1Pass(ctx, b, binDir, cfg, 0)
		}
	})
	if ptc > 0 {
		b.Run(fmt.Sprintf("publishThenCrash=%g", ptc), func(b *testing.B) {
			for range b.N {
				r1Pass(ctx, b, binDir, cfg, ptc)
			}
		})
	}
}

// r1RestartBound is the order rate the provider's crash-restart cycle can
// carry with publishThenCrash at ptc: each order crashes the provider with
// probability ptc, so an offered rate needs ptc × rate restarts per second,
// and the closed-loop probe showed how many the stack manages per second at
// full tilt (restarts over elapsed). The probe alone overstates what an
// open-loop load can sustain: with 64 orders in flight, crashing jobs that
// complete together share one restart (one run's probe read 15.7 orders/s,
// the next 5.9 on the same code), while an open-loop load of a few orders a
// second pays a restart for nearly every crashing job. No restart in the
// probe gives no bound (+Inf).
func r1RestartBound(ptc float64, restarts int, elapsed time.Duration) float64 {
	if restarts <= 0 || elapsed <= 0 {
		return math.Inf(1)
	}
	return float64(restarts) / elapsed.Seconds() / ptc
}

// r1Config are the knobs of one R1 pass.
type r1Config struct {
	rate           float64 // 0: r1LoadShare of the capacity probe's (or of the restart bound, when lower)
	capN           int
	warmup, period time.Duration
}

// r1Pass runs R1 once on a stack of its own with the provider's
// publishThenCrash at ptc.
func r1Pass(ctx context.Context, b *testing.B, binDir string, cfg r1Config, ptc float64) {
	b.Helper()
	rate, capN, warmup, period := cfg.rate, cfg.capN, cfg.warmup, cfg.period
	ports, err := localstack.FreePorts()
	if err != nil {
		b.Fatal(err)
	}
	logw := &lockedWriter{w: new(bytes.Buffer)}
	// Its own PostgreSQL cluster (no DatabaseURL): the benchmark crashes it.
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir: binDir,
		Ports:  ports,
		Fsync:  os.Getenv(benchkit.EnvFsync) == "on",
		Log:    logw,
		ExtraEnv: map[string][]string{"provider-sim": {
			"PROVIDER_FAULT_PUBLISH_THEN_CRASH=" + strconv.FormatFloat(ptc, 'f', -1, 64),
			"PROVIDER_FAULT_SEED=7",
			// The provider's own execution time is not ours to measure.
			"PROVIDER_EXEC_BASE=1ms", "PROVIDER_EXEC_PER_POSITION=0s", "PROVIDER_POLL_INTERVAL=50ms",
		}},
	})
	if err != nil {
		b.Fatalf("start stack: %v\n%s", err, tail(logw.String(), 20000))
	}
	defer func() {
		_ = stack.Stop(30 * time.Second)
		if b.Failed() {
			b.Logf("process logs (tail):\n%s", tail(logw.String(), 30000))
		}
		if dir := os.Getenv("LOSSLESS_R1_LOGS"); dir != "" {
			name := filepath.Join(dir, fmt.Sprintf("r1-publishThenCrash-%g.log", ptc))
			if err := os.WriteFile(name, []byte(logw.String()), 0o600); err != nil {
				b.Errorf("LOSSLESS_R1_LOGS: %v", err)
			}
		}
	}()

	// The capacity under the same faults. With publishThenCrash it is the
	// provider's crash-restart cycle, not the database, that bounds it:
	// every crash is a supervisor restart and a hand-off circuit probe.
	provider := stack.Process("provider-sim")
	restartsBefore := provider.Restarts()
	capacity, err := loadgen.Run(ctx, loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second),
		BaseURL: stack.URLs()["workorder"], Count: capN, Concurrency: 64, MaxPositions: 10, Wait: 10 * time.Minute, Seed: 7,
	})
	if err != nil {
		b.Fatal(err)
	}
	if capacity.Invoiced != capacity.Created {
		b.Fatalf("capacity probe: %d of %d invoiced", capacity.Invoiced, capacity.Created)
	}
	b.ReportMetric(capacity.InvoicedPerSec, "capacity_orders/s")
	bound, boundText := math.Inf(1), "none"
	if ptc > 0 {
		bound = r1RestartBound(ptc, provider.Restarts()-restartsBefore, time.Duration(capacity.Elapsed))
	}
	if !math.IsInf(bound, 1) {
		b.ReportMetric(bound, "restart_bound_orders/s")
		boundText = fmt.Sprintf("%.2f orders/s", bound)
	}
	if rate == 0 {
		rate = r1LoadShare * min(capacity.InvoicedPerSec, bound)
	}
	// A fault's recovery windows must fit before the next fault, and the
	// baseline's (from the warm-up's midpoint) before the first one.
	span := r1Consecutive*r1WindowFor(rate) + 2*time.Second
	period = max(period, span)
	warmup = max(warmup, 2*span)
	probed := map[string]bool{}
	for _, id := range capacity.OrderIDs {
		probed[id] = true
	}

	type outcome struct {
		res *loadgen.Result
		err error
	}
	done := make(chan outcome, 1)
	loadStart := time.Now()
	loadEnd := loadStart.Add(warmup + 4*period)
	go func() {
		res, err := loadgen.Run(ctx, loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second),
			BaseURL: stack.URLs()["workorder"], Rate: rate, Duration: loadEnd.Sub(loadStart),
			Concurrency: 64, MaxPositions: 10, Wait: 5 * time.Minute, Seed: 13, CreateRetry: 2 * time.Minute,
		})
		done <- outcome{res, err}
	}()

	faults := []*r1Fault{
		{key: "workorder", what: "SIGKILL workorder"},
		{key: "provider", what: "SIGKILL provider-sim"},
		{key: "billing", what: "SIGKILL billing"},
		{key: "postgres", what: "PostgreSQL crash-restart"},
	}
	restartsBefore = provider.Restarts()
	for i, f := range faults {
		at := loadStart.Add(warmup + time.Duration(i)*period)
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		}
		if f.key == "postgres" {
			f.injected = time.Now()
			if err := stack.RestartPostgres(ctx); err != nil {
				b.Fatal(err)
			}
			f.ready = time.Now()
			continue
		}
		name := map[string]string{"workorder": "workorder", "provider": "provider-sim", "billing": "billing"}[f.key]
		f.injected, f.ready = killAndAwaitReady(ctx, b, stack, name)
	}

	out := <-done
	if out.err != nil {
		b.Fatal(out.err)
	}
	res := out.res
	if res.CreateErrors != 0 || res.Invoiced != res.Created {
		b.Fatalf("load: %d created, %d not accepted, %d invoiced (%v): a benchmark that loses an effect has failed",
			res.Created, res.CreateErrors, res.Invoiced, res.NotInvoiced)
	}
	hist := transitions(ctx, b, stack.DSN["workorder"])
	maps.DeleteFunc(hist, func(id string, _ map[string]time.Time) bool { return probed[id] })
	invoiced := make([]time.Time, 0, len(hist))
	for _, h := range hist {
		invoiced = append(invoiced, h["INVOICED"])
	}
	slices.SortFunc(invoiced, func(x, y time.Time) int { return x.Compare(y) })

	// The control: the same criterion from a point of the warm-up, where
	// only the provider's own faults (if any) disturb the throughput.
	base := &r1Fault{key: "baseline", what: "none (a point of the warm-up)", ready: loadStart.Add(warmup / 2)}
	base.injected = base.ready
	report := []*r1Fault{base}
	report = append(report, faults...)

	var tbl strings.Builder
	tw := tabwriter.NewWriter(&tbl, 2, 8, 2, ' ', tabwriter.AlignRight)
	crashes := publishThenCrashes(logw.String())
	fmt.Fprintln(tw, "fault\tdown (kill→ready)\tback to 90% after ready\tprovider crashes in ready+10s\taffected\tp99 affected\tp99 start→created\tp99 created→handed off\tp99 handed off→completed\tp99 completed→invoiced\t")
	for i, f := range report {
		horizon := loadEnd
		if i+1 < len(report) {
			horizon = report[i+1].injected
		}
		back, ok := recoveryAfter(invoiced, f.ready, horizon, rate)
		backText := fmt.Sprintf("%.1f s", back.Seconds())
		if !ok {
			backText = fmt.Sprintf("> %.1f s (not back)", back.Seconds())
		}
		affected := affectedOrders(res.Started, f.injected, f.ready.Add(r1Margin))
		hops := hopP99s(affected, res.Started, hist)
		inWindow := 0
		for _, c := range crashes {
			if !c.Before(f.ready) && c.Before(f.ready.Add(10*time.Second)) {
				inWindow++
			}
		}
		fmt.Fprintf(tw, "%s\t%.2f s\t%s\t%d\t%d\t%.2f s\t%.2f s\t%.2f s\t%.2f s\t%.2f s\t\n", f.what, f.ready.Sub(f.injected).Seconds(), backText,
			inWindow, len(affected), hops[0].Seconds(), hops[1].Seconds(), hops[2].Seconds(), hops[3].Seconds(), hops[4].Seconds())
		b.ReportMetric(back.Seconds(), "recovery_s_"+f.key)
		if f.key != "baseline" {
			b.ReportMetric(hops[0].Seconds(), "p99_affected_s_"+f.key)
		}
	}
	_ = tw.Flush()
	all := make([]time.Duration, 0, len(hist))
	for id, h := range hist {
		all = append(all, h["INVOICED"].Sub(res.Started[id]))
	}
	slices.Sort(all)
	p50, p99 := pctDur(all, 50), pctDur(all, 99)
	b.ReportMetric(p99.Seconds(), "p99_s_run")
	b.ReportMetric(rate, "rate_orders/s")
	b.Logf("R1 go=%s GOMAXPROCS=%d fsync=%s: capacity %.2f orders/s under the same faults (closed loop, %d orders; restart bound %s); load %.2f orders/s offered, publishThenCrash %.2f, %d orders, all invoiced; provider-sim restarts %d (1 SIGKILL, the rest publishThenCrash)\n%s"+
		"whole run: p50 %.2f s, p99 %.2f s (create→invoiced from the start of the create)\n"+
		"back = start of the first %v window after readiness (sliding by %v; at least 1 s, long enough for %d orders at the offered rate) from which %d back-to-back windows each invoice ≥ %.0f%% of the offered rate",
		runtime.Version(), runtime.GOMAXPROCS(0), onOff(os.Getenv(benchkit.EnvFsync) == "on"), capacity.InvoicedPerSec, capacity.Created, boundText, rate, ptc, len(hist), provider.Restarts()-restartsBefore, tbl.String(), p50.Seconds(), p99.Seconds(), r1WindowFor(rate), r1Step, r1WindowOrders, r1Consecutive, 100*r1Back)
}

// killAndAwaitReady SIGKILLs a supervised service and returns when it was
// killed and when its restarted process first answered /readyz with 200.
func killAndAwaitReady(ctx context.Context, b *testing.B, stack *localstack.Stack, name string) (killed, ready time.Time) {
	b.Helper()
	p := stack.Process(name)
	before := p.Restarts()
	killed = time.Now()
	if err := p.Kill(); err != nil {
		b.Fatal(err)
	}
	u := stack.URLs()[name] + "/readyz"
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if p.Restarts() > before {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			if resp, err := hc.Do(req); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return killed, time.Now()
				}
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s not ready within 2m of its SIGKILL", name)
		}
		select {
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// publishThenCrashes returns when provider-sim logged its publishThenCrash
// fault, i.e. crashed on its own, from the stack's log.
func publishThenCrashes(logs string) []time.Time {
	var out []time.Time
	for line := range strings.Lines(logs) {
		name, rest, ok := strings.Cut(line, "| ")
		if !ok || !strings.HasPrefix(name, "provider-sim") || !strings.Contains(rest, "fault publish_then_crash") {
			continue
		}
		var entry struct {
			Time time.Time `json:"time"`
		}
		if json.Unmarshal([]byte(rest), &entry) == nil {
			out = append(out, entry.Time)
		}
	}
	return out
}

// transitions returns, per order, when it first reached each status.
func transitions(ctx context.Context, b *testing.B, dsn string) map[string]map[string]time.Time {
	b.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT work_order_id::text, to_status, min(occurred_at)
		FROM work_order_transitions GROUP BY 1, 2`)
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]map[string]time.Time{}
	for rows.Next() {
		var id, status string
		var at time.Time
		if err := rows.Scan(&id, &status, &at); err != nil {
			b.Fatal(err)
		}
		if out[id] == nil {
			out[id] = map[string]time.Time{}
		}
		out[id][status] = at
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return out
}

// r1WindowFor is the throughput window at an offered rate (orders/s): at
// least r1Window, long enough to expect r1WindowOrders orders.
func r1WindowFor(rate float64) time.Duration {
	if rate <= 0 {
		return r1Window
	}
	return max(r1Window, time.Duration(float64(r1WindowOrders)/rate*float64(time.Second)).Round(r1Step))
}

// recoveryAfter returns how long after ready throughput was back: the start
// of the first window [s, s+w) (w = r1WindowFor(rate)), s ≥ ready on a
// r1Step grid, such that it and the next r1Consecutive−1 back-to-back
// windows each count at least r1Back × rate × w invoiced orders. Windows
// must end by horizon; false when none qualifies (the duration is then
// horizon − ready).
func recoveryAfter(invoiced []time.Time, ready, horizon time.Time, rate float64) (time.Duration, bool) {
	w := r1WindowFor(rate)
	need := int(math.Ceil(r1Back*rate*w.Seconds() - 1e-9))
	count := func(from time.Time) int {
		lo := sort.Search(len(invoiced), func(i int) bool { return !invoiced[i].Before(from) })
		hi := sort.Search(len(invoiced), func(i int) bool { return !invoiced[i].Before(from.Add(w)) })
		return hi - lo
	}
	for s := ready; !s.Add(r1Consecutive * w).After(horizon); s = s.Add(r1Step) {
		ok := true
		for k := range r1Consecutive {
			if count(s.Add(time.Duration(k)*w)) < need {
				ok = false
				break
			}
		}
		if ok {
			return s.Sub(ready), true
		}
	}
	return horizon.Sub(ready), false
}

// affectedOrders lists the orders whose creation began in [from, to].
func affectedOrders(started map[string]time.Time, from, to time.Time) []string {
	var ids []string
	for id, at := range started {
		if !at.Before(from) && !at.After(to) {
			ids = append(ids, id)
		}
	}
	return ids
}

// hopP99s returns, over ids, the p99 of start→invoiced and of each hop:
// start→CREATED (the API's wait), CREATED→HANDED_OFF, HANDED_OFF→COMPLETED,
// COMPLETED→INVOICED.
func hopP99s(ids []string, started map[string]time.Time, hist map[string]map[string]time.Time) [5]time.Duration {
	var lat [5][]time.Duration
	for _, id := range ids {
		h := hist[id]
		points := []time.Time{started[id], h["CREATED"], h["HANDED_OFF"], h["COMPLETED"], h["INVOICED"]}
		lat[0] = append(lat[0], points[4].Sub(points[0]))
		for k := 1; k < 5; k++ {
			lat[k] = append(lat[k], points[k].Sub(points[k-1]))
		}
	}
	var out [5]time.Duration
	for k := range lat {
		slices.Sort(lat[k])
		out[k] = pctDur(lat[k], 99)
	}
	return out
}

// pctDur is the p-th percentile (nearest rank) of sorted, 0 when empty.
func pctDur(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := max((len(sorted)*p+99)/100, 1)
	return sorted[i-1]
}

func envFloat(b *testing.B, name string, def float64) float64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		b.Fatalf("%s=%q: want a non-negative number", name, v)
	}
	return f
}

// TestR1RestartBound pins the crash-restart bound that keeps R1's
// publishThenCrash pass from offering a rate only a 64-order burst reaches.
func TestR1RestartBound(t *testing.T) {
	for _, c := range []struct {
		ptc      float64
		restarts int
		elapsed  time.Duration
		want     float64
	}{
		{ptc: 0.2, restarts: 10, elapsed: 10 * time.Second, want: 5}, // 1 restart/s carries 5 orders/s at 20 %
		{ptc: 0.5, restarts: 3, elapsed: 2 * time.Second, want: 3},
		{ptc: 0.2, restarts: 0, elapsed: 10 * time.Second, want: math.Inf(1)},
		{ptc: 0.2, restarts: 4, elapsed: 0, want: math.Inf(1)},
	} {
		if got := r1RestartBound(c.ptc, c.restarts, c.elapsed); math.Abs(got-c.want) > 1e-9 && got != c.want {
			t.Errorf("r1RestartBound(%g, %d, %v) = %g, want %g", c.ptc, c.restarts, c.elapsed, got, c.want)
		}
	}
}
