package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Trace context across asynchronous hops (docs/adr/0009): the producer writes
// its span's W3C context next to the record it leaves behind (outbox row
// headers, Pub/Sub attributes, inbox row, job row); whoever later consumes
// the record starts a NEW trace whose span carries a LINK to that producer
// span. The helpers below are the two halves, with the W3C propagator used
// explicitly so the stored form never depends on process-wide settings.

// W3C trace context keys, as stored in headers, attributes and columns.
const (
	KeyTraceparent = "traceparent"
	KeyTracestate  = "tracestate"
)

// TraceHeaders returns the W3C traceparent and tracestate of the span in ctx,
// or "" when ctx carries no valid span (tracing off).
func TraceHeaders(ctx context.Context) (traceparent, tracestate string) {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c[KeyTraceparent], c[KeyTracestate]
}

// ProducerLink returns the link to the producer span stored as traceparent
// and tracestate, and false when they are absent or malformed (an event
// written while tracing was off, or by a foreign producer).
func ProducerLink(traceparent, tracestate string) (trace.Link, bool) {
	if traceparent == "" {
		return trace.Link{}, false
	}
	c := propagation.MapCarrier{KeyTraceparent: traceparent}
	if tracestate != "" {
		c[KeyTracestate] = tracestate
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), c))
	if !sc.IsValid() {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc}, true
}

// StartLinked starts the span of one consumed record: a new root (its own
// trace), of kind consumer, linked to the producer span when the record
// carries one. A new root rather than a child: the consumer runs at its own
// time, maybe after retries and hours of delay, and may handle many records
// from many traces in one batch; a child would stretch the producer's trace
// over all of that (ADR 0009).
func StartLinked(ctx context.Context, tracer trace.Tracer, name, traceparent, tracestate string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	opts = append([]trace.SpanStartOption{trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer)}, opts...)
	if l, ok := ProducerLink(traceparent, tracestate); ok {
		opts = append(opts, trace.WithLinks(l))
	}
	return tracer.Start(ctx, name, opts...)
}
