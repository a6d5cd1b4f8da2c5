package web_test

import (
	"context"
	"html"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lossless-dev/lossless/internal/devtools/tracestore"
)

// otlpSpan is one span exported to the trace store; ids are short readable
// strings padded to their byte length.
type otlpSpan struct {
	service, trace, span, parent, name string
	from, to                           time.Duration // after traceBase
	attrs                              map[string]string
	link                               [2]string // trace, span
	linkEvent                          string
	failed                             string // status message of an ERROR span
}

var traceBase = time.Date(2026, 4, 1, 8, 0, 0, 0, time.UTC)

func otlpID(s string, n int) []byte {
	b := make([]byte, n)
	copy(b, s)
	return b
}

func otlpAttrs(m map[string]string) []*commonpb.KeyValue {
	var out []*commonpb.KeyValue
	for k, v := range m {
		out = append(out, &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}})
	}
	return out
}

func export(t *testing.T, store *tracestore.Store, spans ...otlpSpan) {
	t.Helper()
	req := &collectortrace.ExportTraceServiceRequest{}
	for _, f := range spans {
		sp := &tracepb.Span{TraceId: otlpID(f.trace, 16), SpanId: otlpID(f.span, 8), Name: f.name,
			StartTimeUnixNano: uint64(traceBase.Add(f.from).UnixNano()), EndTimeUnixNano: uint64(traceBase.Add(f.to).UnixNano()),
			Attributes: otlpAttrs(f.attrs)}
		if f.parent != "" {
			sp.ParentSpanId = otlpID(f.parent, 8)
		}
		if f.link[0] != "" {
			var a map[string]string
			if f.linkEvent != "" {
				a = map[string]string{"event_id": f.linkEvent}
			}
			sp.Links = []*tracepb.Span_Link{{TraceId: otlpID(f.link[0], 16), SpanId: otlpID(f.link[1], 8), Attributes: otlpAttrs(a)}}
		}
		if f.failed != "" {
			sp.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: f.failed}
		}
		req.ResourceSpans = append(req.ResourceSpans, &tracepb.ResourceSpans{
			Resource:   &resourcepb.Resource{Attributes: otlpAttrs(map[string]string{"service.name": f.service})},
			ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{sp}}},
		})
	}
	if _, err := store.Export(context.Background(), req); err != nil {
		t.Fatal(err)
	}
}

var wfRowRE = regexp.MustCompile(`(?s)<tr data-depth="(\d+)"[^>]*>\s*<td><span class="svc">([^<]+)</span></td>\s*<td class="wf-name[^"]*">(.*?)</td>\s*` +
	`<td class="num">([^<]+)</td>\s*<td class="num">([^<]+)</td>\s*<td class="wf-bar-col"><svg[^>]*aria-hidden="true"[^>]*><rect x="(\d+)" y="0" width="(\d+)"`)

var tagRE = regexp.MustCompile(`<[^>]+>`)

// The order's page reads the real trace store's HTTP API and draws one row
// per span in the store's tree order: indented by depth across parent and
// link edges, database spans folded into a count on the span that ran
// them, bars placed relative to the order's first span, numbers as text.
func TestOrderPage_TraceWaterfallFromTheTraceStore(t *testing.T) {
	srv, err := tracestore.Start(tracestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	br := newBrowser(t, orderConsole(t, srv.URL).URL)

	// Before any span: the section says so, the page stands.
	code, page, hdr := br.do(http.MethodGet, "/orders/"+orderID, nil)
	if code != http.StatusOK || !strings.Contains(page, "No spans for this order among the 0") {
		t.Fatalf("order page before any span: %d, no \"no spans\" sentence", code)
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "style-src 'self'") {
		t.Fatalf("CSP %q: the bars are drawn for a policy without inline style", csp)
	}

	aggregate := map[string]string{"outbox.aggregate_id": orderID}
	db := map[string]string{"db.system.name": "postgresql"}
	ms := time.Millisecond
	export(t, srv.Store,
		otlpSpan{service: "workorder", trace: "t-create", span: "create", name: "lossless.workorder.v1.WorkOrderService/CreateWorkOrder", from: 0, to: 10 * ms},
		otlpSpan{service: "workorder", trace: "t-create", span: "ins", parent: "create", name: "INSERT outbox", from: ms, to: 2 * ms, attrs: db},
		otlpSpan{service: "workorder", trace: "t-handoff", span: "disp", name: "outbox dispatch lossless.events.v1.WorkOrderHandOffRequested",
			from: 20 * ms, to: 30 * ms, attrs: aggregate, link: [2]string{"t-create", "ins"}},
		otlpSpan{service: "workorder", trace: "t-handoff", span: "submit", parent: "disp", name: "lossless.provider.v1.ProviderService/SubmitWorkOrder",
			from: 21 * ms, to: 29 * ms, failed: "provider unavailable"},
		otlpSpan{service: "billing", trace: "t-invoice", span: "inv", name: "outbox dispatch lossless.events.v1.InvoiceIssued",
			from: 500 * ms, to: 510 * ms, attrs: aggregate},
		otlpSpan{service: "workorder", trace: "t-billed", span: "proc", name: "process workorder.billing-events",
			from: 600 * ms, to: 1000 * ms, link: [2]string{"t-invoice", "inv"}, linkEvent: "ev-invoiced"},
		otlpSpan{service: "workorder", trace: "t-billed", span: "q1", parent: "proc", name: "UPDATE work_orders", from: 610 * ms, to: 620 * ms, attrs: db},
		otlpSpan{service: "workorder", trace: "t-billed", span: "q2", parent: "proc", name: "INSERT inbox", from: 620 * ms, to: 630 * ms, attrs: db},
		// Another order's span stays out (the store's choice, shown as is).
		otlpSpan{service: "workorder", trace: "t-other", span: "other", name: "outbox dispatch other", from: 5 * ms, to: 6 * ms,
			attrs: map[string]string{"outbox.aggregate_id": "another-order"}},
	)

	code, page, _ = br.do(http.MethodGet, "/orders/"+orderID, nil)
	if code != http.StatusOK {
		t.Fatalf("order page: %d", code)
	}
	type wfRow struct{ depth, service, name, start, dur, x, width string }
	var got []wfRow
	for _, m := range wfRowRE.FindAllStringSubmatch(page, -1) {
		name := strings.Join(strings.Fields(tagRE.ReplaceAllString(m[3], "")), " ")
		got = append(got, wfRow{m[1], m[2], html.UnescapeString(name), html.UnescapeString(m[4]), m[5], m[6], m[7]})
	}
	want := []wfRow{
		{"0", "workorder", "lossless.workorder.v1.WorkOrderService/CreateWorkOrder (1 db spans)", "+0.0ms", "10.0ms", "0", "10"},
		{"1", "workorder", "level 1: ↳ linked hop: outbox dispatch lossless.events.v1.WorkOrderHandOffRequested", "+20.0ms", "10.0ms", "20", "10"},
		{"2", "workorder", "level 2: lossless.provider.v1.ProviderService/SubmitWorkOrder ERROR: provider unavailable", "+21.0ms", "8.0ms", "21", "8"},
		{"0", "billing", "outbox dispatch lossless.events.v1.InvoiceIssued", "+500.0ms", "10.0ms", "500", "10"},
		{"1", "workorder", "level 1: ↳ linked hop: process workorder.billing-events (2 db spans)", "+600.0ms", "400.0ms", "600", "400"},
	}
	if len(got) != len(want) {
		t.Fatalf("waterfall rows:\n%q\nwant:\n%q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d: %q, want %q", i, got[i], want[i])
		}
	}
	for _, s := range []string{"8 spans in 4 traces, 1.000s from the first start to the last end", "3 database spans folded",
		`<tr data-depth="2" class="wf-failed">`, `class="wf-name d2"`} {
		if !strings.Contains(page, s) {
			t.Errorf("page lacks %q", s)
		}
	}
	if strings.Contains(page, "another-order") || strings.Contains(page, "outbox dispatch other") {
		t.Error("another order's span is on the page")
	}
	// The CSP refuses inline style: none is written.
	if strings.Contains(page, "style=") {
		t.Error("the page carries an inline style attribute, which its CSP refuses")
	}
}

// A trace store that does not answer is the trace section's error; the
// rest of the order's page renders. The "store" hangs up on every
// connection (a closed port could be taken by another process meanwhile).
func TestOrderPage_TraceStoreUnreachable(t *testing.T) {
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	dead := "http://" + ln.Addr().String()
	br := newBrowser(t, orderConsole(t, dead).URL)
	code, page, _ := br.do(http.MethodGet, "/orders/"+orderID, nil)
	if code != http.StatusOK {
		t.Fatalf("order page: %d", code)
	}
	i := strings.Index(page, `id="tr-h"`)
	j := strings.Index(page, `id="inv-h"`)
	if i < 0 || j < i {
		t.Fatal("no trace section before the invoice section")
	}
	if section := page[i:j]; !strings.Contains(section, `role="alert">trace store: `) || !strings.Contains(section, ln.Addr().String()) {
		t.Errorf("trace section %s: want the store's error", section)
	}
	for _, s := range []string{`data-order-field="status">INVOICED`, "INV-2026-000042", `data-order-field="timeline"`} {
		if !strings.Contains(page, s) {
			t.Errorf("page lacks %q while the trace store is down", s)
		}
	}
}
