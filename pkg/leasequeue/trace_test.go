package leasequeue_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// The enqueuer's trace context is stored with the job, and the attempt runs
// under a new trace linked to it (docs/adr/0009).
func TestJobAttemptSpanLinksToTheEnqueuer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	q, err := leasequeue.New(b.pool, leasequeue.Config{Name: "traced"},
		slog.New(slog.NewJSONHandler(io.Discard, nil)), nil, leasequeue.WithTracerProvider(tp), leasequeue.WithClock(b.clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	ectx, enqueuer := tp.Tracer("test").Start(context.Background(), "intake")
	traceparent, tracestate := telemetry.TraceHeaders(ectx)
	if _, err := q.Enqueue(ectx, b.pool, leasequeue.NewJob{UniqueKey: "order-1", Payload: []byte("x"),
		Traceparent: traceparent, Tracestate: tracestate}); err != nil {
		t.Fatal(err)
	}
	enqueuer.End()

	seen := make(chan trace.SpanContext, 1)
	w, err := leasequeue.NewWorker(q, func(ctx context.Context, _ leasequeue.Job) (leasequeue.Complete, error) {
		seen <- trace.SpanContextFromContext(ctx)
		return nil, nil
	}, fastWorker(leasequeue.WorkerConfig{Owner: "a", Workers: 1}))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, w)
	defer stop()
	var handlerSpan trace.SpanContext
	select {
	case handlerSpan = <-seen:
	case <-time.After(10 * time.Second):
		t.Fatal("job not handled")
	}
	var attempt sdktrace.ReadOnlySpan
	waitfor.Condition(t, 10*time.Second, "attempt span ended", func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == "job traced" {
				attempt = s
				return true
			}
		}
		return false
	})
	if attempt.SpanContext().SpanID() != handlerSpan.SpanID() {
		t.Error("the handler did not run under the attempt span")
	}
	if attempt.Parent().IsValid() || len(attempt.Links()) != 1 || attempt.Links()[0].SpanContext.SpanID() != enqueuer.SpanContext().SpanID() {
		t.Errorf("attempt span: parent %v, links %v; want a new root linked to the enqueuer", attempt.Parent(), attempt.Links())
	}
}
