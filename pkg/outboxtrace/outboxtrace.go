// Package outboxtrace decorates outbox dispatchers with tracing: each
// dispatch of an outbox event runs under its own span, a new trace LINKED to
// the span that wrote the event (the traceparent in the row's headers), not a
// child of it (docs/adr/0009-trace-propagation-across-async-hops.md). The
// dispatcher's own calls (a gRPC hand-off, a Pub/Sub publish) are children
// of that span, and what they carry onward (gRPC metadata, the message's
// traceparent attribute) names it as the producer of the next hop.
//
// A decorator rather than code in the relay: pkg/outbox stays free of
// tracing, and a service chooses per dispatcher what to trace.
package outboxtrace

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Dispatchers returns ds with every dispatcher traced on tp. A nil tp
// returns ds unchanged.
func Dispatchers(tp trace.TracerProvider, ds map[string]outbox.Dispatcher) map[string]outbox.Dispatcher {
	if tp == nil {
		return ds
	}
	tracer := tp.Tracer("github.com/lossless-dev/lossless/pkg/outboxtrace")
	out := make(map[string]outbox.Dispatcher, len(ds))
	for typ, d := range ds {
		out[typ] = &dispatcher{next: d, tracer: tracer}
	}
	return out
}

type dispatcher struct {
	next   outbox.Dispatcher
	tracer trace.Tracer
}

// Dispatch runs the wrapped dispatcher under the span "outbox dispatch <type>".
func (d *dispatcher) Dispatch(ctx context.Context, ev outbox.Event) (outbox.Commit, error) {
	ctx, span := telemetry.StartLinked(ctx, d.tracer, "outbox dispatch "+ev.Type,
		ev.Headers[outbox.HeaderTraceparent], ev.Headers[outbox.HeaderTracestate],
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
