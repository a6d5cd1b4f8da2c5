package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/internal/devtools/loadgen"
	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
)

// Definitions of benchmark M1.
const (
	// m1Every is the RSS sampling period.
	m1Every = 250 * time.Millisecond
	// m1LimitMB is the target: no service's sampled RSS above it, at 50 %
	// load or during the burst and its drain.
	m1LimitMB = 150
	// m1BurstFactor multiplies the 50 % rate during the burst.
	m1BurstFactor = 10
	// "Bounded": the burst-and-drain maximum at most m1BurstBound × the
	// steady maximum, and the RSS after the drain and settle back within
	// m1EndBound × the steady maximum.
	m1BurstBound = 2.0
	m1EndBound   = 1.5
)

// Phases of M1, as written in m1_rss.csv.
const (
	m1PhaseCapacity = "capacity"
	m1PhaseSteady   = "steady"
	m1PhaseBurst    = "burst"
	m1PhaseDrain    = "drain"
	m1PhaseSettle   = "settle"
)

// BenchmarkM1_Memory measures the resident memory (VmRSS from
// /proc/<pid>/status, sampled every 250 ms) of every service process
// (benchmark M1 of docs/performance.md): a closed-loop capacity probe, then
// open-loop load at 50 % of that capacity, then a burst at 10 × that rate
// (creates retried with their Idempotency-Key while the API pushes back),
// then the drain until every order is invoiced, then an idle settle. Every
// order must be invoiced exactly once, or the benchmark fails. Environment:
//
//	LOSSLESS_M1_DURATION    50 % phase (default 30s)
//	LOSSLESS_M1_BURST       burst phase at 10 × the 50 % rate (default 10s)
//	LOSSLESS_M1_SETTLE      idle phase after the drain; "RSS at the end" is its last sample (default 5s)
//	LOSSLESS_M1_CAPACITY_N  orders of the closed-loop capacity probe (default 300)
//	LOSSLESS_M1_PPROF       a directory: every service serves /debug/pprof (PPROF_ADDR), and M1
//	                        saves each one's heap profile there at the end of the burst and after
//	                        the settle (m1_heap_<service>_{burst,end}.pb.gz; go tool pprof -top)
//	LOSSLESS_BENCH_DATA     a directory for m1_rss.csv (t_s,service,rss_mb,phase)
//	LOSSLESS_PG_FSYNC=on    fsync on the shared PostgreSQL server (make bench)
func BenchmarkM1_Memory(b *testing.B) {
	steadyFor := envDuration(b, "LOSSLESS_M1_DURATION", 30*time.Second)
	burstFor := envDuration(b, "LOSSLESS_M1_BURST", 10*time.Second)
	settleFor := envDuration(b, "LOSSLESS_M1_SETTLE", 5*time.Second)
	capN := envInt(b, "LOSSLESS_M1_CAPACITY_N", 300)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	pprofDir := os.Getenv("LOSSLESS_M1_PPROF")
	stack, base := startBenchStack(b, "m1_", pprofDir != "")

	for range b.N {
		s := newRSSSampler(stack)
		sampleCtx, stopSampling := context.WithCancel(ctx)
		sampled := make(chan struct{})
		go func() { defer close(sampled); s.run(sampleCtx) }()

		capacity := m1Load(ctx, b, "capacity probe", loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second), BaseURL: base, Count: capN, Concurrency: 64, MaxPositions: 10, Wait: 5 * time.Minute, Seed: 7})
		rate := 0.5 * capacity.InvoicedPerSec

		s.setPhase(m1PhaseSteady)
		steady := m1Load(ctx, b, "50% load", loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second),
			BaseURL: base, Rate: rate, Duration: steadyFor, Concurrency: 64, MaxPositions: 10, Wait: 5 * time.Minute, Seed: 11,
		})

		// The burst's creation ends after burstFor (the load generator's
		// ticker drops the ticks it cannot serve); its Run returns once the
		// backlog has drained.
		s.setPhase(m1PhaseBurst)
		var burstEnd sync.WaitGroup
		burstEnd.Add(1)
		drainAt := time.AfterFunc(burstFor, func() {
			defer burstEnd.Done()
			s.setPhase(m1PhaseDrain)
			if pprofDir != "" {
				if err := m1Heaps(ctx, stack, pprofDir, "burst"); err != nil {
					b.Error(err)
				}
			}
		})
		burst := m1Load(ctx, b, "burst", loadgen.Config{HTTP: callerHTTP(b, stack, 10*time.Second),
			BaseURL: base, Rate: m1BurstFactor * rate, Duration: burstFor, Concurrency: 256, MaxPositions: 10,
			Wait: 10 * time.Minute, Seed: 13, CreateRetry: 2 * time.Minute,
		})
		if drainAt.Stop() {
			burstEnd.Done()
		}
		burstEnd.Wait()
		s.setPhase(m1PhaseSettle)
		settled := time.NewTimer(settleFor)
		select {
		case <-settled.C:
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		}
		stopSampling()
		<-sampled
		if pprofDir != "" {
			if err := m1Heaps(ctx, stack, pprofDir, "end"); err != nil {
				b.Fatal(err)
			}
		}

		created := capacity.Created + steady.Created + burst.Created
		m1InvoicedExactlyOnce(ctx, b, stack, created)
		for _, in := range stack.Instances() {
			if n := stack.Process(in.ID).Restarts(); n != 0 {
				b.Fatalf("%s restarted %d times during M1: its RSS series is not one process's", in.ID, n)
			}
		}
		if err := s.err(); err != nil {
			b.Fatal(err)
		}
		if dir := os.Getenv("LOSSLESS_BENCH_DATA"); dir != "" {
			if err := s.writeCSV(filepath.Join(dir, "m1_rss.csv")); err != nil {
				b.Fatal(err)
			}
		}

		b.ReportMetric(capacity.InvoicedPerSec, "capacity_orders/s")
		b.ReportMetric(rate, "rate_orders/s")
		b.ReportMetric(burst.AchievedRate, "burst_created_orders/s")
		var tbl strings.Builder
		tw := tabwriter.NewWriter(&tbl, 2, 8, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "service\tsteady max MB\tburst+drain max MB\tend MB\tVmHWM MB\tburst/steady\tend/steady\t≤ 150 MB\tbounded\t")
		for _, svc := range s.services {
			r := s.summary(svc)
			b.ReportMetric(r.steadyMax, "rss_mb_steady_"+svc)
			b.ReportMetric(r.burstMax, "rss_mb_burst_"+svc)
			b.ReportMetric(r.end, "rss_mb_end_"+svc)
			b.ReportMetric(r.hwm, "hwm_mb_"+svc)
			b.ReportMetric(r.burstMax/r.steadyMax, "burst/steady_"+svc)
			b.ReportMetric(r.end/r.steadyMax, "end/steady_"+svc)
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%s\t%s\t\n", svc, r.steadyMax, r.burstMax, r.end, r.hwm,
				r.burstMax/r.steadyMax, r.end/r.steadyMax, metText(max(r.steadyMax, r.burstMax) <= m1LimitMB),
				metText(r.burstMax <= m1BurstBound*r.steadyMax && r.end <= m1EndBound*r.steadyMax))
		}
		_ = tw.Flush()
		b.Logf("M1 go=%s GOMAXPROCS=%d PostgreSQL %s fsync=%s: capacity %.1f orders/s (closed loop, %d orders); 50%% load %.1f orders/s for %v (%d orders); burst offered %.1f, created %.1f orders/s for %v (%d orders); all %d invoiced exactly once\n%s"+
			"target: every service ≤ %d MB sampled RSS in the 50%% and burst+drain phases; bounded = burst+drain max ≤ %.1f × steady max and end (after a %v idle settle) ≤ %.1f × steady max",
			runtime.Version(), runtime.GOMAXPROCS(0), m1ServerVersion(ctx, b, stack), os.Getenv(benchkit.EnvFsync), capacity.InvoicedPerSec, capacity.Created,
			rate, steadyFor, steady.Created, m1BurstFactor*rate, burst.AchievedRate, burstFor, burst.Created, created,
			tbl.String(), m1LimitMB, m1BurstBound, settleFor, m1EndBound)
	}
}

func metText(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT MET"
}

// m1Load runs one load phase and fails the benchmark unless every order it
// created was invoiced and every create was accepted.
func m1Load(ctx context.Context, b *testing.B, what string, cfg loadgen.Config) *loadgen.Result {
	b.Helper()
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		b.Fatalf("%s: %v", what, err)
	}
	if res.CreateErrors != 0 || res.Invoiced != res.Created {
		b.Fatalf("%s: %d created, %d not accepted, %d invoiced (not invoiced: %v): a benchmark that loses an effect has failed",
			what, res.Created, res.CreateErrors, res.Invoiced, res.NotInvoiced)
	}
	return res
}

// m1InvoicedExactlyOnce checks the databases rather than the load
// generator's view: the work-order service holds exactly the orders created,
// every one INVOICED with an invoice id, and billing issued one invoice each
// (invoices.work_order_id is UNIQUE, so a count equal to the orders' and
// every order's invoice found means one each, no more, no less).
func m1InvoicedExactlyOnce(ctx context.Context, b *testing.B, stack *localstack.Stack, created int) {
	b.Helper()
	one := func(db, q string) int {
		conn, err := pgx.Connect(ctx, stack.DSN[db])
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
			b.Fatalf("%s: %s: %v", db, q, err)
		}
		return n
	}
	orders := one("workorder", `SELECT count(*) FROM work_orders`)
	invoicedOrders := one("workorder", `SELECT count(*) FROM work_orders WHERE status = 'INVOICED' AND invoice_id IS NOT NULL`)
	invoices := one("billing", `SELECT count(*) FROM invoices`)
	if orders != created || invoicedOrders != created || invoices != created {
		b.Fatalf("%d orders created by the load; the work-order service holds %d, %d of them INVOICED; billing issued %d invoices: want all equal",
			created, orders, invoicedOrders, invoices)
	}
}

// m1Heaps saves every service's heap profile into dir as
// m1_heap_<service>_<when>.pb.gz.
func m1Heaps(ctx context.Context, stack *localstack.Stack, dir, when string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	for _, in := range stack.Instances() {
		if in.Replica != 1 {
			continue
		}
		svc := in.Service
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, in.PprofURL+"/debug/pprof/heap", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("%s heap profile: %w", svc, err)
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return fmt.Errorf("%s heap profile: %w", svc, err)
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s heap profile: HTTP %d: %s", svc, resp.StatusCode, body)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("m1_heap_%s_%s.pb.gz", svc, when)), body, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// m1ServerVersion is the PostgreSQL server's version, for the report.
func m1ServerVersion(ctx context.Context, b *testing.B, stack *localstack.Stack) string {
	b.Helper()
	conn, err := pgx.Connect(ctx, stack.DSN["workorder"])
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&v); err != nil {
		b.Fatal(err)
	}
	return v
}

// rssSampler reads VmRSS and VmHWM of every service process every m1Every,
// labelling each sample with the phase current when it was taken.
type rssSampler struct {
	stack    *localstack.Stack
	services []string          // service names, in start order
	ids      map[string]string // service name -> instance id of its replica 1
	start    time.Time

	mu      sync.Mutex
	phase   string
	samples []rssSample
	errs    []error
}

type rssSample struct {
	at             time.Duration // since the sampler started
	service, phase string
	rssKB, hwmKB   int64
}

func newRSSSampler(stack *localstack.Stack) *rssSampler {
	s := &rssSampler{stack: stack, ids: map[string]string{}, start: time.Now(), phase: m1PhaseCapacity}
	for _, in := range stack.Instances() {
		if in.Replica == 1 {
			s.services = append(s.services, in.Service)
			s.ids[in.Service] = in.ID
		}
	}
	return s
}

func (s *rssSampler) setPhase(p string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = p
}

func (s *rssSampler) run(ctx context.Context) {
	t := time.NewTicker(m1Every)
	defer t.Stop()
	for {
		s.sample()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *rssSampler) sample() {
	at := time.Since(s.start)
	s.mu.Lock()
	phase := s.phase
	s.mu.Unlock()
	for _, svc := range s.services {
		// Read the pid at every sample: a supervised restart changes it (and
		// fails the benchmark afterwards).
		pid := s.stack.Process(s.ids[svc]).Pid()
		rss, hwm, err := procMemory(pid)
		s.mu.Lock()
		if err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s (pid %d) at %v: %w", svc, pid, at, err))
		} else {
			s.samples = append(s.samples, rssSample{at: at, service: svc, phase: phase, rssKB: rss, hwmKB: hwm})
		}
		s.mu.Unlock()
	}
}

func (s *rssSampler) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// m1Summary is one service's figures, in MB (2^20 bytes).
type m1Summary struct{ steadyMax, burstMax, end, hwm float64 }

func (s *rssSampler) summary(svc string) m1Summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	var r m1Summary
	for _, x := range s.samples {
		if x.service != svc {
			continue
		}
		mb := float64(x.rssKB) / 1024
		switch x.phase {
		case m1PhaseSteady:
			r.steadyMax = max(r.steadyMax, mb)
		case m1PhaseBurst, m1PhaseDrain:
			r.burstMax = max(r.burstMax, mb)
		}
		r.end, r.hwm = mb, float64(x.hwmKB)/1024 // the last sample's
	}
	return r
}

func (s *rssSampler) writeCSV(name string) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "t_s,service,rss_mb,phase")
	s.mu.Lock()
	for _, x := range s.samples {
		fmt.Fprintf(w, "%.3f,%s,%.2f,%s\n", x.at.Seconds(), x.service, float64(x.rssKB)/1024, x.phase)
	}
	s.mu.Unlock()
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// procMemory returns VmRSS and VmHWM of a process, in kB, from
// /proc/<pid>/status (Linux).
func procMemory(pid int) (rssKB, hwmKB int64, err error) {
	if pid == 0 {
		return 0, 0, errors.New("not running")
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }() // read only
	sc := bufio.NewScanner(f)
	found := 0
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %q: %w", key, val, err)
		}
		if key == "VmRSS" {
			rssKB = n
		} else {
			hwmKB = n
		}
		found++
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if found != 2 {
		return 0, 0, errors.New("no VmRSS/VmHWM in /proc status")
	}
	return rssKB, hwmKB, nil
}
