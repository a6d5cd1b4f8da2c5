package inbox

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// The relay's metrics and spans: what an operator sees of each batch.

type relayMetrics struct {
	outcomes  metric.Int64Counter
	latency   metric.Float64Histogram
	failures  metric.Int64Counter
	fallbacks metric.Int64Counter
	panics    metric.Int64Counter
}

// startSpan starts the span that applies a claimed batch: a new root linked
// to the span that stored each entry (up to telemetry.SpanLimits' links).
func (r *Relay) startSpan(ctx context.Context, claimed []Entry, batched bool) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(claimed))
	for i := range claimed {
		if l, ok := telemetry.ProducerLink(claimed[i].Traceparent, claimed[i].Tracestate); ok {
			l.Attributes = []attribute.KeyValue{attribute.Int64("inbox.id", claimed[i].ID), attribute.String("event_id", claimed[i].EventID)}
			links = append(links, l)
		}
	}
	return r.tracer.Start(ctx, "inbox apply", trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("inbox.batch.size", len(claimed)), attribute.Bool("inbox.batch.set_based", batched)))
}

// record counts each resolved entry by outcome (and an applied one's
// receive-to-apply latency).
func (r *Relay) record(ctx context.Context, claimed []Entry, outs []outcome) {
	for i, o := range outs {
		label := o.disposition.String()
		switch o.status {
		case StatusApplied:
			label = "applied"
			r.m.latency.Record(ctx, time.Since(claimed[i].ReceivedAt).Seconds())
		case StatusParked:
			label = "parked"
		default:
			if o.panicked {
				label = "panic"
			}
		}
		attrs := []attribute.KeyValue{attribute.String("outcome", label)}
		if o.parkReason != nil {
			attrs = append(attrs, attribute.String("reason", *o.parkReason))
		}
		r.m.outcomes.Add(ctx, 1, metric.WithAttributes(attrs...))
	}
}
