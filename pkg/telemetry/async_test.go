package telemetry_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// An async hop: the producer's context is stored as text, and the consumer's
// span is a new trace linked to the producer span, not its child.
func TestStartLinkedIsANewTraceLinkedToTheProducer(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tracer := tp.Tracer("test")

	pctx, producer := tracer.Start(context.Background(), "producer")
	traceparent, tracestate := telemetry.TraceHeaders(pctx)
	producer.End()
	if traceparent == "" {
		t.Fatal("no traceparent for a recording span")
	}

	// The consumer runs under an unrelated span of its own process.
	lctx, local := tracer.Start(context.Background(), "poll loop")
	_, consumer := telemetry.StartLinked(lctx, tracer, "consume", traceparent, tracestate)
	consumer.End()
	local.End()

	var got sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "consume" {
			got = s
		}
	}
	switch {
	case got == nil:
		t.Fatal("consumer span not recorded")
	case got.Parent().IsValid():
		t.Errorf("consumer span has parent %v; want a new root", got.Parent().SpanID())
	case got.SpanContext().TraceID() == producer.SpanContext().TraceID():
		t.Error("consumer span is in the producer's trace; want its own")
	case len(got.Links()) != 1 || got.Links()[0].SpanContext.SpanID() != producer.SpanContext().SpanID():
		t.Errorf("links %v; want one link to the producer span", got.Links())
	case got.SpanKind() != trace.SpanKindConsumer:
		t.Errorf("kind %v, want consumer", got.SpanKind())
	}
}

func TestNoProducerContextMeansNoLink(t *testing.T) {
	t.Parallel()
	for _, tp := range []string{"", "garbage", "00-00000000000000000000000000000000-0000000000000000-01"} {
		if _, ok := telemetry.ProducerLink(tp, ""); ok {
			t.Errorf("ProducerLink(%q) = ok; want no link", tp)
		}
	}
	if tp, ts := telemetry.TraceHeaders(context.Background()); tp != "" || ts != "" {
		t.Errorf("TraceHeaders without a span = %q, %q; want empty", tp, ts)
	}
}
