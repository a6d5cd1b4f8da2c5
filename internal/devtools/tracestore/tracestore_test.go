package tracestore

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// fake builds spans with readable ids: trace "t1", span "s1" become hex.
type fake struct {
	service string
	trace   string
	span    string
	parent  string
	name    string
	start   time.Duration // after base
	attrs   map[string]string
	links   []fakeLink
}

type fakeLink struct{ trace, span, eventID string }

var base = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func id(s string, n int) []byte {
	b := make([]byte, n)
	copy(b, s)
	return b
}

func kvs(m map[string]string) []*commonpb.KeyValue {
	var out []*commonpb.KeyValue
	for k, v := range m {
		out = append(out, &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}})
	}
	return out
}

func request(spans ...fake) *collectortrace.ExportTraceServiceRequest {
	req := &collectortrace.ExportTraceServiceRequest{}
	for _, f := range spans {
		sp := &tracepb.Span{
			TraceId: id(f.trace, 16), SpanId: id(f.span, 8), Name: f.name,
			StartTimeUnixNano: uint64(base.Add(f.start).UnixNano()), EndTimeUnixNano: uint64(base.Add(f.start + time.Millisecond).UnixNano()),
			Attributes: kvs(f.attrs),
		}
		if f.parent != "" {
			sp.ParentSpanId = id(f.parent, 8)
		}
		for _, l := range f.links {
			var a map[string]string
			if l.eventID != "" {
				a = map[string]string{"event_id": l.eventID}
			}
			sp.Links = append(sp.Links, &tracepb.Span_Link{TraceId: id(l.trace, 16), SpanId: id(l.span, 8), Attributes: kvs(a)})
		}
		req.ResourceSpans = append(req.ResourceSpans, &tracepb.ResourceSpans{
			Resource:   &resourcepb.Resource{Attributes: kvs(map[string]string{"service.name": f.service})},
			ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{sp}}},
		})
	}
	return req
}

func hexID(s string, n int) string { return hex.EncodeToString(id(s, n)) }

// twoOrders: orders A and B each created, dispatched (outbox span with the
// aggregate id), received in ONE shared Pub/Sub pull batch (links to both
// dispatches, event ids eA and eB), then applied in one inbox batch each.
func twoOrders() []fake {
	return []fake{
		{service: "workorder", trace: "tA", span: "create", name: "CreateWorkOrder A", start: 0},
		{service: "workorder", trace: "tA", span: "insert", parent: "create", name: "INSERT A", start: time.Millisecond,
			attrs: map[string]string{"db.system.name": "postgresql"}},
		{service: "workorder", trace: "dA", span: "dispA", name: "outbox dispatch A", start: 10 * time.Millisecond,
			attrs: map[string]string{"outbox.aggregate_id": "order-A", "outbox.event_id": "eA"}, links: []fakeLink{{"tA", "insert", ""}}},
		{service: "workorder", trace: "tB", span: "createB", name: "CreateWorkOrder B", start: 2 * time.Millisecond},
		{service: "workorder", trace: "dB", span: "dispB", name: "outbox dispatch B", start: 11 * time.Millisecond,
			attrs: map[string]string{"outbox.aggregate_id": "order-B", "outbox.event_id": "eB"}, links: []fakeLink{{"tB", "createB", ""}}},
		{service: "billing", trace: "pull", span: "batch", name: "process batch", start: 20 * time.Millisecond,
			links: []fakeLink{{"dA", "dispA", "eA"}, {"dB", "dispB", "eB"}}},
		{service: "billing", trace: "pull", span: "ins", parent: "batch", name: "INSERT inbox", start: 21 * time.Millisecond,
			attrs: map[string]string{"db.system.name": "postgresql"}},
		{service: "billing", trace: "apA", span: "applyA", name: "apply A", start: 30 * time.Millisecond, links: []fakeLink{{"pull", "ins", "eA"}}},
		{service: "billing", trace: "apB", span: "applyB", name: "apply B", start: 31 * time.Millisecond, links: []fakeLink{{"pull", "ins", "eB"}}},
		{service: "billing", trace: "jA", span: "jobA", name: "job A", start: 40 * time.Millisecond,
			attrs: map[string]string{"job.unique_key": "order-A"}, links: []fakeLink{{"apA", "applyA", ""}}},
	}
}

func TestOrder_FollowsLinksAcrossTracesAndKeepsOtherOrdersOfABatchOut(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Export(context.Background(), request(twoOrders()...)); err != nil {
		t.Fatal(err)
	}
	o := s.Order("order-A")
	var got []string
	for _, sp := range o.Spans {
		got = append(got, fmt.Sprintf("%d %s %s", sp.Depth, sp.Via, sp.Name))
	}
	want := []string{
		"0  CreateWorkOrder A",
		"1 child INSERT A",
		"2 link outbox dispatch A",
		"3 link process batch",
		"4 child INSERT inbox",
		"5 link apply A",
		"6 link job A",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("order-A tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if o.Traces != 5 || o.Stored != len(twoOrders()) {
		t.Fatalf("traces %d stored %d, want 5 and %d", o.Traces, o.Stored, len(twoOrders()))
	}
	if p := o.Spans[2].TreeParent; p != hexID("tA", 16)+"/"+hexID("insert", 8) {
		t.Fatalf("dispatch hangs under %q, want the INSERT it was written by", p)
	}
	// Printed: database spans counted on the span above them, the spans
	// under them moved up.
	var b bytes.Buffer
	if err := WriteTree(&b, o, false); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		fmt.Sprintf("%-14s %s", "workorder", "CreateWorkOrder A  (1 db spans)"),
		fmt.Sprintf("%-14s %s", "workorder", "  ↳ outbox dispatch A"),
		fmt.Sprintf("%-14s %s", "billing", "    ↳ process batch  (1 db spans)"),
		fmt.Sprintf("%-14s %s", "billing", "      ↳ apply A"),
		fmt.Sprintf("%-14s %s", "billing", "        ↳ job A"),
	} {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("tree lacks the line %q:\n%s", line, b.String())
		}
	}
	if strings.Contains(b.String(), "INSERT") {
		t.Errorf("database spans printed without queries:\n%s", b.String())
	}
	var all bytes.Buffer
	if err := WriteTree(&all, o, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(all.String(), fmt.Sprintf("%-14s %s", "billing", "        INSERT inbox")) {
		t.Errorf("with queries, INSERT inbox not at depth 4:\n%s", all.String())
	}
	if strings.Contains(b.String(), " B") {
		t.Errorf("order B's spans in order A's tree:\n%s", b.String())
	}
}

func TestStore_MaxSpansEvictsTheOldest(t *testing.T) {
	s, err := New(Config{MaxSpans: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		_, _ = s.Export(context.Background(), request(fake{service: "workorder", trace: "t", span: fmt.Sprint(i), name: "s",
			attrs: map[string]string{"outbox.aggregate_id": fmt.Sprint("order-", i)}}))
	}
	if n := s.Len(); n != 3 {
		t.Fatalf("holds %d spans, want the cap 3", n)
	}
	for i, want := range []int{0, 0, 1, 1, 1} {
		if got := len(s.Order(fmt.Sprint("order-", i)).Spans); got != want {
			t.Errorf("order-%d: %d spans, want %d (the two oldest evicted)", i, got, want)
		}
	}
}

func TestStore_MaxAgeEvictsSpansReceivedLongerAgo(t *testing.T) {
	now := base
	s, err := New(Config{MaxAge: time.Minute}, WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = s.Export(context.Background(), request(fake{service: "w", trace: "t", span: "old", attrs: map[string]string{"k": "order-old"}}))
	now = now.Add(45 * time.Second)
	_, _ = s.Export(context.Background(), request(fake{service: "w", trace: "t", span: "new", attrs: map[string]string{"k": "order-new"}}))
	now = now.Add(30 * time.Second)
	if len(s.Order("order-old").Spans) != 0 || len(s.Order("order-new").Spans) != 1 || s.Len() != 1 {
		t.Fatalf("after 75 s: old %d, new %d, len %d; want the span older than MaxAge gone", len(s.Order("order-old").Spans), len(s.Order("order-new").Spans), s.Len())
	}
}

// TestServer_OTLPInHTTPOut: a span exported over OTLP/gRPC is answered by
// the HTTP API (Fetch), the path make trace takes.
func TestServer_OTLPInHTTPOut(t *testing.T) {
	srv, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(strings.TrimPrefix(srv.OTLPEndpoint, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	if _, err := collectortrace.NewTraceServiceClient(conn).Export(ctx, request(twoOrders()...)); err != nil {
		t.Fatal(err)
	}
	o, err := Fetch(ctx, srv.URL, "order-B")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sp := range o.Spans {
		names = append(names, sp.Name)
	}
	if want := "CreateWorkOrder B,outbox dispatch B,process batch,INSERT inbox,apply B"; strings.Join(names, ",") != want {
		t.Fatalf("order-B over HTTP: %v, want %s", names, want)
	}
}
