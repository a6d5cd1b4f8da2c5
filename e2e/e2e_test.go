// Package e2e boots the whole system as separate processes, the way `make
// run` does (internal/devtools/localstack), drives it only through its public REST
// APIs with every provider fault knob on, crashes a service with SIGKILL
// mid-run, and asserts the invariants of docs (I1-I7) on the databases.
package e2e

import (
	"bytes"
	"context"
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
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/devtools/loadgen"
	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// TestMain takes the test server from the environment (internal/testkit/benchkit):
// make bench runs the benchmarks with fsync on.
func TestMain(m *testing.M) {
	code := benchkit.Main(m)
	builds.remove()
	os.Exit(code)
}

// Orders of the run: over 200, so that each fault knob hits many of them.
const orders = 240

func TestEndToEnd_EveryValidOrderInvoicedExactlyOnceUnderFaultsAndACrash(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs every service")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	binDir := buildServices(ctx, t)
	ports, err := localstack.FreePorts()
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	logw := &lockedWriter{w: &logs}
	prefix := "e2e_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_"
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir:         binDir,
		DatabaseURL:    pgtest.ServerDSN(t),
		DatabasePrefix: prefix,
		Ports:          ports,
		Log:            logw,
		ExtraEnv: map[string][]string{
			"provider-sim": {
				// Every knob on at a non-trivial rate (F2, F4, F5, F8, F9, F14).
				"PROVIDER_FAULT_DUPLICATE=0.2",
				"PROVIDER_FAULT_EARLY_COMPLETION=0.2",
				"PROVIDER_FAULT_SPLIT_COMPLETION=0.2",
				"PROVIDER_FAULT_POISON=0.05",
				"PROVIDER_FAULT_UNKNOWN_ORDER=0.05",
				"PROVIDER_FAULT_PUBLISH_THEN_CRASH=0.02",
				"PROVIDER_FAULT_SEED=42",
				"PROVIDER_EXEC_BASE=20ms",
				"PROVIDER_EXEC_PER_POSITION=1ms",
				"PROVIDER_POLL_INTERVAL=50ms",
			},
			"workorder": {
				// Unknown orders park after a short, bounded deadline (F8).
				// It must still exceed the slowest hand-off under load, or
				// an early completion (F5) parks as NOT_WAITING before its
				// order is handed off, which is the designed outcome of a
				// deadline too short for the system's latency.
				"WORKORDER_INBOX_MAX_ATTEMPTS=5",
				"WORKORDER_INBOX_MAX_AGE=20s",
				"WORKORDER_INBOX_DEFER_BACKOFF_BASE=100ms",
				"WORKORDER_INBOX_DEFER_BACKOFF_MAX=500ms",
			},
		},
	})
	if err != nil {
		t.Fatalf("start stack: %v\n%s", err, logw.String())
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = stack.Stop(20 * time.Second)
		}
		if t.Failed() {
			t.Logf("process logs (tail):\n%s", tail(logw.String(), 20000))
		}
	})

	wo := openDB(t, stack.DSN["workorder"])
	billing := openDB(t, stack.DSN["billing"])
	provider := openDB(t, stack.DSN["providersim"])

	// Load in the background; crash billing with SIGKILL once invoicing is
	// under way, and let its supervisor restart it (F12 at process level).
	type outcome struct {
		res *loadgen.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := loadgen.Run(ctx, loadgen.Config{HTTP: callerHTTP(t, stack, 10*time.Second),
			BaseURL: stack.URLs()["workorder"], Count: orders, Concurrency: 8, MaxPositions: 50, Wait: 4 * time.Minute,
		})
		done <- outcome{res, err}
	}()
	waitfor.Condition(t, 3*time.Minute, "some invoices issued before the crash", func() bool {
		return count(t, billing, "SELECT count(*) FROM invoices") >= 20
	})
	if err := stack.Process("billing").Kill(); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, time.Minute, "billing restarted", func() bool {
		return stack.Process("billing").Restarts() >= 1 && stack.WaitReady(ctx, "billing") == nil
	})

	out := <-done
	if out.err != nil {
		t.Fatal(out.err)
	}
	res := out.res
	if res.Created != orders || res.CreateErrors != 0 {
		t.Fatalf("created %d orders with %d errors, want %d and 0", res.Created, res.CreateErrors, orders)
	}

	// No order stuck: every valid order invoiced.
	if res.Invoiced != orders {
		for id := range res.NotInvoiced {
			explain(t, id, wo, billing, provider)
		}
		t.Fatalf("%d of %d orders invoiced; not invoiced: %v", res.Invoiced, orders, res.NotInvoiced)
	}
	// I3: exactly one invoice per work order.
	if n := count(t, billing, "SELECT count(*) FROM invoices"); n != orders {
		t.Errorf("invoices = %d, want %d", n, orders)
	}
	if n := count(t, billing, "SELECT count(*) FROM (SELECT work_order_id FROM invoices GROUP BY 1 HAVING count(*) > 1) d"); n != 0 {
		t.Errorf("%d work orders have more than one invoice", n)
	}
	// Every order's invoice is the one the work-order service recorded.
	for _, id := range res.OrderIDs {
		var woInvoice, status string
		if err := wo.QueryRow(ctx, "SELECT coalesce(invoice_id::text, ''), status FROM work_orders WHERE id = $1", id).Scan(&woInvoice, &status); err != nil {
			t.Fatal(err)
		}
		var billed string
		if err := billing.QueryRow(ctx, "SELECT id::text FROM invoices WHERE work_order_id = $1", id).Scan(&billed); err != nil {
			t.Fatalf("order %s: no invoice in billing: %v", id, err)
		}
		if status != "INVOICED" || woInvoice != billed {
			t.Fatalf("order %s: status %s invoice %q, billing issued %s", id, status, woInvoice, billed)
		}
		// The load generator's latency is update_time − create_time: the
		// order's timestamps must be its first and its INVOICED transition's.
		var timesMatch bool
		if err := wo.QueryRow(ctx, `SELECT w.created_at = min(t.occurred_at)
			AND w.updated_at = min(t.occurred_at) FILTER (WHERE t.to_status = 'INVOICED')
			FROM work_orders w JOIN work_order_transitions t ON t.work_order_id = w.id
			WHERE w.id = $1 GROUP BY w.id`, id).Scan(&timesMatch); err != nil || !timesMatch {
			t.Fatalf("order %s: created_at/updated_at are not its first/INVOICED transition times (err %v)", id, err)
		}
	}
	// I2/I5: poison and unknown-order messages are parked with their reason
	// and raw payload; nothing else is parked and nothing stays open. An
	// unknown order's entry is parked at its deadline (WORKORDER_INBOX_MAX_AGE),
	// which can come after the last invoice: wait for it first.
	waitfor.Value(t, time.Minute, "open inbox entries drained", 0, func() int {
		return count(t, wo, "SELECT count(*) FROM inbox WHERE status = 'OPEN'")
	})
	parked := map[string]int{}
	rows, err := wo.Query(ctx, "SELECT park_reason, count(*) FROM inbox WHERE status = 'PARKED' AND payload IS NOT NULL GROUP BY 1")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var reason string
		var n int
		if err := rows.Scan(&reason, &n); err != nil {
			t.Fatal(err)
		}
		parked[reason] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if parked["POISON"] == 0 || parked["UNKNOWN_ORDER"] == 0 {
		t.Errorf("parked by reason = %v, want POISON and UNKNOWN_ORDER entries", parked)
	}
	for reason := range parked {
		if reason != "POISON" && reason != "UNKNOWN_ORDER" {
			t.Errorf("unexpected parked reason %s (%d entries)", reason, parked[reason])
		}
	}
	// F4: duplicates are absorbed by the inbox's unique key at insert, so
	// they leave no row; the receiver counts them.
	if n := duplicatesAbsorbed(t, stack.MetricsURLs()["workorder"]); n == 0 {
		t.Errorf("no duplicate absorbed although duplicate=0.2 (F4)")
	}
	// Reconciliation: every completed-and-invoiced order has a done job and
	// an invoice; no job is dead or stuck.
	if n := count(t, billing, "SELECT count(*) FROM leasequeue_jobs WHERE state <> 'done'"); n != 0 {
		t.Errorf("%d billing jobs not done", n)
	}

	// Graceful shutdown of every service: SIGTERM -> exit 0 within its
	// timeout, no lease or claim left behind.
	stopped = true
	if err := stack.Stop(30 * time.Second); err != nil {
		t.Fatalf("graceful shutdown: %v", err)
	}
	if n := count(t, billing, "SELECT count(*) FROM leasequeue_jobs WHERE state = 'running'"); n != 0 {
		t.Errorf("%d billing jobs still leased after shutdown", n)
	}
	// An outbox claim is a row lock of the relay's transaction: it cannot
	// outlive the process. What must hold is that every event was delivered:
	// the outbox keeps only undelivered rows (PENDING, FAILED), so it is empty.
	for name, db := range map[string]*pgxpool.Pool{"workorder": wo, "billing": billing} {
		if n := count(t, db, "SELECT count(*) FROM outbox"); n != 0 {
			t.Errorf("%s: %d outbox events not delivered after shutdown", name, n)
		}
	}
	// I3 on the wire: one InvoiceIssued per order, published once (billing
	// was killed mid-run; its events may be dispatched twice, never recorded twice).
	if n := count(t, billing, "SELECT count(*) FROM outbox_published WHERE event_type = 'lossless.events.v1.InvoiceIssued'"); n != orders {
		t.Errorf("billing: %d InvoiceIssued events published, want %d", n, orders)
	}
	if n := count(t, provider, "SELECT count(*) FROM jobs WHERE lease_until > now()"); n != 0 {
		t.Errorf("provider-sim: %d jobs still leased after shutdown", n)
	}
	if n := count(t, provider, "SELECT count(*) FROM jobs WHERE status <> 'DONE'"); n != 0 {
		t.Errorf("provider-sim: %d jobs unfinished", n)
	}
	t.Logf("e2e: %d orders invoiced; parked %v; p50 %s p99 %s", res.Invoiced, parked, res.LatencyP50, res.LatencyP99)
}

// duplicatesAbsorbed sums the receiver's duplicate counter from /metrics.
func duplicatesAbsorbed(t *testing.T, base string) float64 {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, base+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if strings.Contains(line, "inbox_received") && strings.Contains(line, `outcome="duplicate"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// buildServices builds every service and command the stack runs into a
// temporary folder of tb's, from this checkout, and returns the folder.
func buildServices(ctx context.Context, tb testing.TB) string {
	tb.Helper()
	dir, err := builds.get(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return dir
}

// builds holds the stack's binaries, built once for all the tests and
// benchmarks of this package's run (each used to build its own: up to a
// minute of a loaded machine's time per test, spent on linking the same
// binaries again); TestMain removes them. The processes only read them.
var builds sharedBuild

type sharedBuild struct {
	once sync.Once
	dir  string
	err  error
}

func (s *sharedBuild) get(ctx context.Context) (string, error) {
	s.once.Do(func() {
		if s.dir, s.err = os.MkdirTemp("", "lossless-e2e-bin-"); s.err != nil {
			return
		}
		_, thisFile, _, _ := runtime.Caller(0)
		s.err = localstack.Build(ctx, filepath.Dir(filepath.Dir(thisFile)), s.dir)
	})
	if s.err != nil {
		return "", fmt.Errorf("building the stack (once for the package): %w", s.err)
	}
	return s.dir, nil
}

func (s *sharedBuild) remove() {
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// checkInvoicedOnce asserts that every accepted order is INVOICED with the
// invoice billing issued for it, for positions × unit price in the order's
// currency, explaining each order that is not; it fails the test at once if
// any is not invoiced and returns how many carry a wrong invoice.
func checkInvoicedOnce(ctx context.Context, t *testing.T, accepted []string, wo, billing, provider *pgxpool.Pool) (wrong int) {
	t.Helper()
	notInvoiced := 0
	for _, id := range accepted {
		var status, woInvoice, currency string
		var positions, unit int64
		if err := wo.QueryRow(ctx, `SELECT status, coalesce(invoice_id::text, ''), positions, unit_price_minor, currency_code
			FROM work_orders WHERE id = $1`, id).Scan(&status, &woInvoice, &positions, &unit, &currency); err != nil {
			t.Fatalf("order %s: %v", id, err)
		}
		var billed, billedCurrency string
		var total int64
		err := billing.QueryRow(ctx, `SELECT id::text, total_minor, currency_code FROM invoices WHERE work_order_id = $1`, id).Scan(&billed, &total, &billedCurrency)
		if status != "INVOICED" || err != nil {
			notInvoiced++
			explain(t, id, wo, billing, provider)
			t.Errorf("order %s: status %s, invoice in billing: %v", id, status, err)
			continue
		}
		if woInvoice != billed || total != positions*unit || billedCurrency != currency {
			wrong++
			t.Errorf("order %s: recorded invoice %q, billing issued %s for %d %s, want %d %s",
				id, woInvoice, billed, total, billedCurrency, positions*unit, currency)
		}
	}
	if notInvoiced > 0 {
		t.Fatalf("%d of %d accepted orders not invoiced", notInvoiced, len(accepted))
	}
	return wrong
}

// explain logs everything the three databases know about one order, so a
// stuck order can be diagnosed from the test output alone.
func explain(t *testing.T, id string, wo, billing, provider *pgxpool.Pool) {
	t.Helper()
	dump := func(name string, db *pgxpool.Pool, q string) {
		rows, err := db.Query(context.Background(), q, id)
		if err != nil {
			t.Logf("%s: %v", name, err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			vals, _ := rows.Values()
			t.Logf("%s %s: %v", id, name, vals)
		}
	}
	dump("order", wo, "SELECT status, positions, completed_items, provider_job_id FROM work_orders WHERE id = $1")
	dump("transition", wo, "SELECT from_status, to_status, cause, occurred_at FROM work_order_transitions WHERE work_order_id = $1 ORDER BY id")
	dump("waiting point", wo, "SELECT id, consumed_at, consumed_by FROM waiting_points WHERE work_order_id = $1")
	dump("inbox", wo, "SELECT id, event_type, status, park_reason, attempts, last_error, received_at FROM inbox WHERE correlation_key = $1 ORDER BY id")
	dump("outbox", wo, "SELECT event_type, status, attempts, last_error, published_at FROM outbox_events WHERE aggregate_id = $1 ORDER BY id")
	dump("provider job", provider, "SELECT status, positions, created_at FROM jobs WHERE work_order_id = $1::uuid")
	dump("provider event", provider, "SELECT e.seq, e.kind, e.copies, e.published_at, e.publish_count FROM job_events e JOIN jobs j USING (job_id) WHERE j.work_order_id = $1::uuid ORDER BY e.seq")
	dump("billing job", billing, "SELECT state, attempts, last_error FROM leasequeue_jobs WHERE unique_key = $1")
	dump("billing outbox", billing, "SELECT event_type, status, attempts, last_error, published_at FROM outbox_events WHERE aggregate_id = $1 ORDER BY id")
}

func openDB(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func count(t *testing.T, db *pgxpool.Pool, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
