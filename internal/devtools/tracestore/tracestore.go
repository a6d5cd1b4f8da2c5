// Package tracestore is the trace backend of `make run`: an OTLP/gRPC trace
// receiver keeping the spans the services export in memory, bounded
// (Config.MaxSpans, Config.MaxAge), and an HTTP endpoint returning the spans
// of one work order, across the traces its asynchronous hops link together
// (docs/observability.md, "Traces: following one order"). `make trace
// ORDER=<id>` prints them as a tree (WriteTree); no Jaeger needed.
//
// # HTTP API
//
//	GET /v1/orders/{id}
//
// answers 200 with an Order as JSON (an empty "spans" when none is known):
//
//	{
//	  "order_id": "0b7c…",
//	  "stored": 5123,              // spans held by the store in all
//	  "traces": 9,                 // distinct trace ids among "spans"
//	  "start": "2025-…Z",          // earliest span start (RFC 3339, ns)
//	  "end": "2025-…Z",            // latest span end
//	  "spans": [{
//	    "trace_id": "…", "span_id": "…", "parent_span_id": "…",  // hex; parent "" for a trace root
//	    "service": "workorder", "instance": "workorder-1",
//	    "name": "outbox dispatch lossless.events.v1.WorkOrderHandOffRequested",
//	    "kind": "INTERNAL",        // SERVER, CLIENT, PRODUCER, CONSUMER, INTERNAL
//	    "start": "…", "end": "…", "duration_ms": 9.31,
//	    "status": "ERROR", "status_message": "…",  // status omitted unless ERROR
//	    "attributes": {"outbox.aggregate_id": "0b7c…"},  // values as strings
//	    "links": [{"trace_id": "…", "span_id": "…", "attributes": {"event_id": "…"}}],
//	    "tree_parent": "<trace_id>/<span_id>",  // the span it hangs under; "" for a root of the tree
//	    "via": "link",             // "child" (parent span) or "link" (an asynchronous hop)
//	    "depth": 3                 // 0 for a root
//	  }, …]
//	}
//
// "spans" is in tree order (depth-first, siblings by start time), so a
// waterfall renders it row by row: indent by depth, bar from start to end.
//
// # Which spans belong to an order
//
// Seeds are the spans with an attribute whose value is the order id
// (outbox.aggregate_id, job.unique_key, work_order.id). From them the chain
// grows: a span's parent; the one span a span with exactly one link links to
// (the producer of the record it handled); a span linking to a span of the
// chain when that span carries the order (a seed or under one) or when the
// link names an event id of the order (event_id). Batch spans (one Pub/Sub
// pull, one claimed inbox batch) link to many records: only their links to
// the order's records are followed, so other orders of the batch stay out.
// Every descendant of a chain span is shown with it.
package tracestore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Config of a Store.
type Config struct {
	// MaxSpans bounds the spans kept; beyond it the oldest are dropped.
	// Default 100 000: a few hundred orders of `make demo`, tens of MB.
	MaxSpans int
	// MaxAge drops spans received longer ago. Default 15 min: `make trace`
	// is for the order just watched, not for history.
	MaxAge time.Duration
}

func (c *Config) setDefaults() {
	if c.MaxSpans == 0 {
		c.MaxSpans = 100_000
	}
	if c.MaxAge == 0 {
		c.MaxAge = 15 * time.Minute
	}
}

// Validate checks the values.
func (c Config) Validate() error {
	if c.MaxSpans < 1 {
		return fmt.Errorf("tracestore: MaxSpans %d: want at least 1", c.MaxSpans)
	}
	if c.MaxAge <= 0 {
		return fmt.Errorf("tracestore: MaxAge %v: want a positive duration", c.MaxAge)
	}
	return nil
}

// Option changes a Store for tests.
type Option func(*Store)

// WithClock replaces time.Now (MaxAge is measured on it).
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// Store keeps exported spans and answers per-order queries. It is the
// OTLP TraceService: register it on a gRPC server, or use Start.
type Store struct {
	collectortrace.UnimplementedTraceServiceServer
	cfg Config
	now func() time.Time

	mu    sync.Mutex
	spans []stored // oldest first, from first on
	first int
}

type stored struct {
	span     Span
	received time.Time
}

// New returns an empty store.
func New(cfg Config, opts ...Option) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Span is one exported span, as the HTTP API returns it.
type Span struct {
	TraceID       string            `json:"trace_id"`
	SpanID        string            `json:"span_id"`
	ParentSpanID  string            `json:"parent_span_id,omitempty"`
	Service       string            `json:"service"`
	Instance      string            `json:"instance,omitempty"`
	Name          string            `json:"name"`
	Kind          string            `json:"kind"`
	Start         time.Time         `json:"start"`
	End           time.Time         `json:"end"`
	DurationMS    float64           `json:"duration_ms"`
	Status        string            `json:"status,omitempty"`
	StatusMessage string            `json:"status_message,omitempty"`
	Attributes    map[string]string `json:"attributes,omitempty"`
	Links         []Link            `json:"links,omitempty"`
	// Set in an Order: the place in its tree.
	TreeParent string `json:"tree_parent,omitempty"`
	Via        string `json:"via,omitempty"`
	Depth      int    `json:"depth"`
}

// Link is a span's link to the span that produced what it handled.
type Link struct {
	TraceID    string            `json:"trace_id"`
	SpanID     string            `json:"span_id"`
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Key is "<trace_id>/<span_id>", the form of TreeParent.
func (s Span) Key() string { return s.TraceID + "/" + s.SpanID }

func (l Link) key() string { return l.TraceID + "/" + l.SpanID }

// Export is the OTLP TraceService's one method.
func (s *Store) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	var in []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				in = append(in, convert(sp, res["service.name"], res["service.instance.id"]))
			}
		}
	}
	s.add(in...)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func convert(sp *tracepb.Span, service, instance string) Span {
	start := time.Unix(0, int64(sp.GetStartTimeUnixNano())).UTC() //nolint:gosec // nanoseconds since 1970 fit in int64 until 2262
	end := time.Unix(0, int64(sp.GetEndTimeUnixNano())).UTC()     //nolint:gosec // as above
	out := Span{
		TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
		ParentSpanID: hex.EncodeToString(sp.GetParentSpanId()),
		Service:      service, Instance: instance, Name: sp.GetName(),
		Kind:  kindName(sp.GetKind()),
		Start: start, End: end, DurationMS: float64(end.Sub(start)) / float64(time.Millisecond),
		Attributes: attrs(sp.GetAttributes()),
	}
	if sp.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		out.Status, out.StatusMessage = "ERROR", sp.GetStatus().GetMessage()
	}
	for _, l := range sp.GetLinks() {
		out.Links = append(out.Links, Link{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId()), Attributes: attrs(l.GetAttributes())})
	}
	return out
}

func kindName(k tracepb.Span_SpanKind) string {
	switch k {
	case tracepb.Span_SPAN_KIND_SERVER:
		return "SERVER"
	case tracepb.Span_SPAN_KIND_CLIENT:
		return "CLIENT"
	case tracepb.Span_SPAN_KIND_PRODUCER:
		return "PRODUCER"
	case tracepb.Span_SPAN_KIND_CONSUMER:
		return "CONSUMER"
	default:
		return "INTERNAL"
	}
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	if len(kvs) == 0 {
		return nil
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = v.GetStringValue()
		case *commonpb.AnyValue_IntValue:
			out[kv.GetKey()] = fmt.Sprint(v.GetIntValue())
		case *commonpb.AnyValue_BoolValue:
			out[kv.GetKey()] = fmt.Sprint(v.GetBoolValue())
		case *commonpb.AnyValue_DoubleValue:
			out[kv.GetKey()] = fmt.Sprint(v.GetDoubleValue())
		}
	}
	return out
}

// add appends spans, then drops what exceeds MaxSpans or MaxAge.
func (s *Store) add(spans ...Span) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sp := range spans {
		s.spans = append(s.spans, stored{span: sp, received: now})
	}
	s.evictLocked(now)
}

func (s *Store) evictLocked(now time.Time) {
	if over := len(s.spans) - s.first - s.cfg.MaxSpans; over > 0 {
		clear(s.spans[s.first : s.first+over]) // let the collector have them
		s.first += over
	}
	cutoff := now.Add(-s.cfg.MaxAge)
	for s.first < len(s.spans) && s.spans[s.first].received.Before(cutoff) {
		s.spans[s.first] = stored{}
		s.first++
	}
	// Compact once the dropped head is half the slice: amortised O(1) per
	// span, memory at most twice MaxSpans.
	if s.first > 0 && s.first >= len(s.spans)/2 {
		n := copy(s.spans, s.spans[s.first:])
		clear(s.spans[n:])
		s.spans, s.first = s.spans[:n], 0
	}
}

// Len is the number of spans held.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked(s.now())
	return len(s.spans) - s.first
}

func (s *Store) snapshot() []Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked(s.now())
	out := make([]Span, 0, len(s.spans)-s.first)
	for _, st := range s.spans[s.first:] {
		out = append(out, st.span)
	}
	return out
}

// Server is a running Store: the OTLP receiver and the HTTP API.
type Server struct {
	Store *Store
	// OTLPEndpoint is the value of OTEL_EXPORTER_OTLP_ENDPOINT for the
	// services: "http://127.0.0.1:<port>" (OTLP/gRPC, no TLS).
	OTLPEndpoint string
	// URL is the HTTP API's base URL.
	URL string

	grpc *grpc.Server
	http *http.Server
}

// Start serves a new Store on two free loopback ports.
func Start(cfg Config, opts ...Option) (*Server, error) {
	store, err := New(cfg, opts...)
	if err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	otlpLis, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tracestore: OTLP listener: %w", err)
	}
	httpLis, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		otlpLis.Close()
		return nil, fmt.Errorf("tracestore: HTTP listener: %w", err)
	}
	srv := &Server{
		Store:        store,
		OTLPEndpoint: "http://" + otlpLis.Addr().String(),
		URL:          "http://" + httpLis.Addr().String(),
		grpc:         grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20)),
		http:         &http.Server{Handler: store.Handler(), ReadHeaderTimeout: 10 * time.Second},
	}
	collectortrace.RegisterTraceServiceServer(srv.grpc, store)
	go func() { _ = srv.grpc.Serve(otlpLis) }()
	go func() { _ = srv.http.Serve(httpLis) }()
	return srv, nil
}

// Close stops both listeners.
func (s *Server) Close() error {
	s.grpc.Stop()
	err := s.http.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
