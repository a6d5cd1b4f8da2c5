package outbox_test

import (
	"context"
	"errors"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// The dispatch runs under its own span, linked to the span that wrote the
// row, and the wrapped dispatcher sees that span (so a gRPC call or a
// publish inside it names the dispatch as its parent or producer).
func TestDispatchSpanLinksToTheRowsWriterAndParentsTheDispatch(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	wctx, writer := tp.Tracer("test").Start(context.Background(), "create request")
	ev, err := outbox.NewEvent(wctx, "work_order", "o-1", &emptypb.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	writer.End()

	var inner trace.SpanContext
	fail := errors.New("provider down")
	ds := outbox.TraceDispatchers(tp, map[string]outbox.Dispatcher{ev.Type: outbox.DispatcherFunc(
		func(ctx context.Context, _ outbox.Event) (outbox.Commit, error) {
			inner = trace.SpanContextFromContext(ctx)
			return nil, fail
		})})
	if _, err := ds[ev.Type].Dispatch(context.Background(), ev); !errors.Is(err, fail) {
		t.Fatalf("error %v not passed through", err)
	}
	spans := rec.Ended()
	var dispatch sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "outbox dispatch "+ev.Type {
			dispatch = s
		}
	}
	if dispatch == nil {
		t.Fatalf("no dispatch span among %d", len(spans))
	}
	if dispatch.Parent().IsValid() || len(dispatch.Links()) != 1 || dispatch.Links()[0].SpanContext.SpanID() != writer.SpanContext().SpanID() {
		t.Errorf("dispatch span: parent %v, links %v; want a root linked to the writer", dispatch.Parent(), dispatch.Links())
	}
	if inner.SpanID() != dispatch.SpanContext().SpanID() {
		t.Error("the wrapped dispatcher did not run under the dispatch span")
	}
	if dispatch.Status().Code.String() != "Error" {
		t.Errorf("status %v after a failed dispatch, want Error", dispatch.Status())
	}
	if tp, _ := telemetry.TraceHeaders(trace.ContextWithSpanContext(context.Background(), inner)); tp == ev.Headers[outbox.HeaderTraceparent] {
		t.Error("the next hop would name the writer, not the dispatch")
	}
}

func TestNilTracerProviderLeavesDispatchersUnchanged(t *testing.T) {
	t.Parallel()
	d := outbox.DispatcherFunc(func(context.Context, outbox.Event) (outbox.Commit, error) { return nil, nil })
	ds := map[string]outbox.Dispatcher{"t": d}
	if got := outbox.TraceDispatchers(nil, ds); len(got) != 1 {
		t.Fatal("dispatchers lost")
	}
}
