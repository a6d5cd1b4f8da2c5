package outbox

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// TraceDispatchers returns ds with every dispatcher traced on tp: each
// dispatch of an event runs under its own span, a new trace LINKED to the
// span that wrote the event (the traceparent in the row's headers), not a
// child of it (docs/adr/0009-trace-propagation-across-async-hops.md). The
// dispatcher's own calls (a gRPC hand-off, a Pub/Sub publish) are children
// of that span, and what they carry onward (gRPC metadata, the message's
// traceparent attribute) names it as the producer of the next hop.
//
// A decorator rather than code in the relay: the relay stays free of
// tracing, and a service chooses per dispatcher what to trace. A nil tp
// returns ds unchanged.
func TraceDispatchers(tp trace.TracerProvider, ds map[string]Dispatcher) map[string]Dispatcher {
	if tp == nil {
		return ds
	}
	tracer := tp.Tracer("github.com/lossless-dev/lossless/pkg/outbox")
	out := make(map[string]Dispatcher, len(ds))
	for typ, d := range ds {
		out[typ] = &tracedDispatcher{next: d, tracer: tracer}
	}
	return out
}

type tracedDispatcher struct {
	next   Dispatcher
	tracer trace.Tracer
}

// Dispatch runs the wrapped dispatcher under the span "outbox dispatch <type>".
func (d *tracedDispatcher) Dispatch(ctx context.Context, ev Event) (Commit, error) {
	ctx, span := telemetry.StartLinked(ctx, d.tracer, "outbox dispatch "+ev.Type,
		ev.Headers[HeaderTraceparent], ev.Headers[HeaderTracestate],
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("outbox.event_id", ev.ID.String()),
			attribute.String("outbox.event_type", ev.Type),
			attribute.String("outbox.aggregate_type", ev.AggregateType),
			attribute.String("outbox.aggregate_id", ev.AggregateID),
			attribute.Int("outbox.attempt", ev.Attempts),
		))
	defer span.End()
	commit, err := d.next.Dispatch(ctx, ev)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "dispatch failed")
		span.SetAttributes(attribute.Bool("outbox.permanent", retry.IsPermanent(err)))
	}
	return commit, err
}
