package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// A REST request's traceparent reaches the gRPC server through the gateway:
// the server span is a child of the caller's span, in the caller's trace.
func TestRESTTraceparentContinuesIntoTheGRPCServerSpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	b := setup(t, server.WithTelemetry(telemetry.Providers{TracerProvider: tp}))

	caller := sdktrace.NewTracerProvider()
	ctx, span := caller.Tracer("client").Start(context.Background(), "client", trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, b.base+"/v1/orders", strings.NewReader(validOrderJSON))
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	// The server ends its span after writing the response, so wait for it.
	var s sdktrace.ReadOnlySpan
	waitfor.Condition(t, 5*time.Second, "PutOrder server span ended", func() bool {
		for _, e := range rec.Ended() {
			if strings.HasSuffix(e.Name(), "/PutOrder") {
				s = e
				return true
			}
		}
		return false
	})
	if s.SpanKind() != trace.SpanKindServer || s.Parent().SpanID() != span.SpanContext().SpanID() ||
		s.SpanContext().TraceID() != span.SpanContext().TraceID() {
		t.Fatalf("server span %q: kind %v, parent %v, trace %v; want a server child of the caller's span",
			s.Name(), s.SpanKind(), s.Parent().SpanID(), s.SpanContext().TraceID())
	}
}
