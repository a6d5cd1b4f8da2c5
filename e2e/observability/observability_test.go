// Package observability runs one work order through the whole system, the
// three services as separate processes (internal/devtools/localstack), and checks the
// two promises of docs/observability.md on what the processes really emit:
//
//   - traces: every service exports OTLP to a collector run by this test,
//     which keeps the spans in memory; the order's journey from the create
//     request to InvoiceIssued is one chain of spans, each asynchronous hop a
//     new trace LINKED to its producer span (docs/adr/0009), and no span is
//     an orphan;
//   - metrics: every metric an alert rule or a dashboard panel reads
//     (deploy/compose/metrics.txt) is in a scrape of the services' /metrics.
//
// Processes rather than the three apps in one test process: each service
// assembles itself in services/<name>/internal/app, which Go's internal rule
// hides from any package outside that service. Processes also exercise what
// an operator runs: the OTLP exporter, W3C propagation over real gRPC and
// Pub/Sub hops, the Prometheus exposition.
package observability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// span is the part of an exported span the assertions read.
type span struct {
	Service  string
	Name     string
	Kind     tracepb.Span_SpanKind
	TraceID  string
	SpanID   string
	ParentID string
	Links    []ref
	Attrs    map[string]string
}

type ref struct{ TraceID, SpanID string }

func (s span) String() string { return fmt.Sprintf("%s %q (%s)", s.Service, s.Name, s.SpanID) }

// collector is an OTLP/gRPC trace receiver keeping every span in memory.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []span
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s := span{Service: service, Name: sp.GetName(), Kind: sp.GetKind(),
					TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					ParentID: hex.EncodeToString(sp.GetParentSpanId()), Attrs: map[string]string{}}
				for _, l := range sp.GetLinks() {
					s.Links = append(s.Links, ref{hex.EncodeToString(l.GetTraceId()), hex.EncodeToString(l.GetSpanId())})
				}
				for _, kv := range sp.GetAttributes() {
					s.Attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
				}
				c.spans = append(c.spans, s)
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (c *collector) add(s span) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spans = append(c.spans, s)
}

func (c *collector) snapshot() []span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.spans)
}

func startCollector(t *testing.T) (string, *collector) {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), c
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func TestObservability_OneOrderTracedAcrossEveryHopAndEveryContractMetricExported(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs every service")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	otlpAddr, spans := startCollector(t)
	binDir := t.TempDir()
	if err := localstack.Build(ctx, repoRoot(), binDir); err != nil {
		t.Fatal(err)
	}
	ports, err := localstack.FreePorts()
	if err != nil {
		t.Fatal(err)
	}
	tracing := []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + otlpAddr,
		// Export within 100 ms instead of the SDK's 5 s, so the test waits little.
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
	var logs lockedBuffer
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir:         binDir,
		DatabaseURL:    pgtest.ServerDSN(t),
		DatabasePrefix: "obs_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "") + "_",
		Ports:          ports,
		Log:            &logs,
		ExtraEnv: map[string][]string{
			"workorder":    tracing,
			"billing":      tracing,
			"provider-sim": append(slices.Clone(tracing), "PROVIDER_EXEC_BASE=10ms", "PROVIDER_EXEC_PER_POSITION=1ms"),
		},
	})
	if err != nil {
		t.Fatalf("start stack: %v\n%s", err, logs.String())
	}
	t.Cleanup(func() {
		_ = stack.Stop(20 * time.Second)
		if t.Failed() {
			t.Logf("process logs (tail):\n%s", tail(logs.String(), 20000))
		}
	})
	base := stack.URLs()["workorder"]

	// The client's own span: the root of the order's first trace.
	clientSpans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(clientSpans))
	cctx, root := tp.Tracer("test-client").Start(ctx, "client create work order", trace.WithSpanKind(trace.SpanKindClient))
	hc, err := stack.CallerHTTPClient(nil)
	if err != nil {
		t.Fatal(err)
	}
	id := createOrder(t, cctx, hc, base)
	root.End()
	for _, s := range clientSpans.GetSpans() {
		spans.add(span{Service: "test-client", Name: s.Name, Kind: tracepb.Span_SPAN_KIND_CLIENT,
			TraceID: s.SpanContext.TraceID().String(), SpanID: s.SpanContext.SpanID().String(), Attrs: map[string]string{}})
	}
	waitfor.Condition(t, 2*time.Minute, "order "+id+" INVOICED", func() bool { return orderStatus(t, hc, base, id) == "WORK_ORDER_STATUS_INVOICED" })

	t.Run("trace chain", func(t *testing.T) {
		var chain []span
		waitfor.Condition(t, 30*time.Second, "the InvoiceIssued consumer span linked back to the create request", func() bool {
			chain = walkBack(spans.snapshot(), "workorder", "process workorder.billing-events")
			return len(chain) > 0 && chain[len(chain)-1].Service == "test-client"
		})
		all := spans.snapshot()
		// The hops, newest first, as walkBack followed them: each either a
		// child of the next (same process or a gRPC call) or LINKED to it (an
		// asynchronous hop). The chain must pass every one, in this order.
		want := []struct {
			service, name string
			linked        bool // reached from the previous one by a link
		}{
			{"workorder", "process workorder.billing-events", false},
			{"billing", "outbox dispatch lossless.events.v1.InvoiceIssued", true},
			{"billing", "job invoices", true},
			{"billing", "process billing.workorder-events", true},
			{"workorder", "outbox dispatch lossless.events.v1.WorkOrderCompletionRecorded", true},
			{"workorder", "inbox apply", true},
			{"workorder", "process workorder.work-order-completed", true},
			{"provider-sim", "provider execute", true},
			{"provider-sim", "lossless.provider.v1.ProviderService/SubmitWorkOrder", true},
			{"workorder", "lossless.provider.v1.ProviderService/SubmitWorkOrder", false},
			{"workorder", "outbox dispatch lossless.events.v1.WorkOrderHandOffRequested", false},
			{"workorder", "lossless.workorder.v1.WorkOrderService/CreateWorkOrder", true},
			{"test-client", "client create work order", false},
		}
		names := make([]string, len(chain))
		for i, s := range chain {
			names[i] = s.Service + ": " + s.Name
		}
		t.Logf("chain, newest first:\n  %s", strings.Join(names, "\n  "))
		if len(chain) != len(want) {
			t.Fatalf("chain has %d hops, want %d:\n  %s", len(chain), len(want), strings.Join(names, "\n  "))
		}
		for i, w := range want {
			if chain[i].Service != w.service || chain[i].Name != w.name {
				t.Errorf("hop %d is %s, want %s %q", i, chain[i], w.service, w.name)
			}
			if i > 0 {
				isLink := chain[i-1].TraceID != chain[i].TraceID
				if isLink != w.linked {
					t.Errorf("hop %d (%s) reached by link=%v, want link=%v", i, chain[i], isLink, w.linked)
				}
			}
		}
		assertNoOrphans(t, all, spans.snapshot)
	})

	t.Run("metrics contract", func(t *testing.T) {
		contract := readContract(t)
		// Gauges appear after their monitor's first refresh (the dead-letter
		// depth is counted by pulling), so poll the scrapes until every name
		// of the contract is exported or the deadline passes.
		var missing, have []string
		if waitfor.Until(60*time.Second, func() bool {
			exported := map[string]string{}
			for svc, url := range stack.MetricsURLs() {
				for fam := range scrapeFamilies(t, url+"/metrics") {
					exported[fam] += svc + " "
				}
			}
			missing, have = missing[:0], have[:0]
			for _, name := range contract {
				if exported[name] == "" {
					missing = append(missing, name)
				}
			}
			for k := range exported {
				if strings.HasPrefix(k, "lossless_") {
					have = append(have, k)
				}
			}
			return len(missing) == 0
		}) {
			return
		}
		sort.Strings(have)
		t.Errorf("metrics read by alerts or dashboards but exported by no service: %v\nexported lossless_* families: %v", missing, have)
	})
}

// walkBack follows, from the newest span named name of service, its parent
// or else its first link, until a span without either: the chain of one
// order's journey, newest first. It returns nil when a step is missing.
func walkBack(all []span, service, name string) []span {
	byID := map[string]span{}
	var start *span
	for i := range all {
		byID[all[i].TraceID+all[i].SpanID] = all[i]
		if all[i].Service == service && all[i].Name == name && len(all[i].Links) > 0 {
			start = &all[i]
		}
	}
	if start == nil {
		return nil
	}
	chain := []span{*start}
	for cur := *start; len(chain) < 50; {
		var next span
		var ok bool
		switch {
		case cur.ParentID != "":
			next, ok = byID[cur.TraceID+cur.ParentID]
		case len(cur.Links) > 0:
			next, ok = byID[cur.Links[0].TraceID+cur.Links[0].SpanID]
		default:
			return chain
		}
		if !ok {
			return chain
		}
		chain = append(chain, next)
		cur = next
	}
	return chain
}

// assertNoOrphans: every span of all has its parent, or links to a span, in
// the spans collected (by now or within a deadline), or is the root of a
// request (a server span: health checks are not traced, every other call is a
// request someone made), or is the test client's own root. The deadline is
// there because a child ends, and is exported, before its parent: a parent
// still open when all was taken arrives in a later export. The set checked is
// fixed at all, since a running system opens new spans all the time.
func assertNoOrphans(t *testing.T, all []span, later func() []span) {
	t.Helper()
	orphans := func(known []span) []span {
		ids := map[string]bool{}
		for _, s := range known {
			ids[s.TraceID+s.SpanID] = true
		}
		var out []span
		for _, s := range all {
			switch {
			case s.Service == "test-client":
			case s.ParentID != "" && ids[s.TraceID+s.ParentID]:
			case s.ParentID == "" && s.Kind == tracepb.Span_SPAN_KIND_SERVER:
			case slices.ContainsFunc(s.Links, func(l ref) bool { return ids[l.TraceID+l.SpanID] }):
			default:
				out = append(out, s)
			}
		}
		return out
	}
	left := orphans(all)
	if len(left) == 0 || waitfor.Until(30*time.Second, func() bool { left = orphans(later()); return len(left) == 0 }) {
		return
	}
	for _, s := range left {
		t.Errorf("orphan span %s: parent %q, links %v (no parent exported within 30 s)", s, s.ParentID, s.Links)
	}
}

func createOrder(t *testing.T, ctx context.Context, hc *http.Client, base string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/work-orders",
		strings.NewReader(`{"customer_id":"acme","description":"paint the fence","positions":3,"unit_price":{"currency_code":"EUR","minor_units":1250}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", uuid.NewString())
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := hc.Do(req) // with the stack's demo ID token
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	var out struct {
		WorkOrder struct {
			ID string `json:"id"`
		} `json:"workOrder"`
	}
	if err := json.Unmarshal(body, &out); err != nil || out.WorkOrder.ID == "" {
		t.Fatalf("create: %v %s", err, body)
	}
	return out.WorkOrder.ID
}

// orderStatus reads the order as its creator (hc carries its ID token): a
// refusal fails the test at once rather than reading as "not yet".
func orderStatus(t *testing.T, hc *http.Client, base, id string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, base+"/v1/work-orders/"+id, nil)
	resp, err := hc.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		t.Fatalf("GET order %s: HTTP %d", id, resp.StatusCode)
	}
	var out struct {
		WorkOrder struct {
			Status string `json:"status"`
		} `json:"workOrder"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return out.WorkOrder.Status
}

// readContract returns the metric family names of deploy/compose/metrics.txt.
func readContract(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "compose", "metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			names = append(names, line)
		}
	}
	if len(names) == 0 {
		t.Fatal("metrics.txt lists no metric")
	}
	return names
}

// scrapeFamilies returns the metric family names of one /metrics exposition
// (its "# TYPE name type" lines).
func scrapeFamilies(t *testing.T, url string) map[string]bool {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	fams := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 4 && f[0] == "#" && f[1] == "TYPE" {
			fams[f[2]] = true
		}
	}
	return fams
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
