package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

func TestLogLinesCarryTraceAndSpanIDs(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := telemetry.NewLogger(&buf, nil)
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	logger.InfoContext(ctx, "hello")
	span.End()
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	if line["trace_id"] != span.SpanContext().TraceID().String() || line["span_id"] != span.SpanContext().SpanID().String() {
		t.Fatalf("log line %v lacks the span's ids", line)
	}
}

func TestMetricsAreExposedInPrometheusFormat(t *testing.T) {
	t.Parallel()
	tel, err := telemetry.Setup(context.Background(), telemetry.Config{ServiceName: "test", LogLevel: "info"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	c, _ := tel.MeterProvider.Meter("t").Int64Counter("test.events")
	c.Add(context.Background(), 3)
	rec := httptest.NewRecorder()
	tel.MetricsHandler.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), "GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "lossless_test_events_total 3") {
		t.Fatalf("counter missing from exposition:\n%s", rec.Body.String())
	}
}

func TestInvalidLogLevelNamesTheVariable(t *testing.T) {
	t.Parallel()
	err := telemetry.Config{ServiceName: "x", LogLevel: "loud"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "LOG_LEVEL") {
		t.Fatalf("error %v does not name LOG_LEVEL", err)
	}
}
