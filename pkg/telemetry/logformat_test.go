package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// logLines runs Setup with cfg and returns what log writes, one map per line.
func logLines(t *testing.T, cfg telemetry.Config, log func(l *telemetry.Telemetry, ctx context.Context)) []map[string]any {
	t.Helper()
	var buf bytes.Buffer
	tel, err := telemetry.Setup(context.Background(), cfg, &buf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	defer span.End()
	log(tel, ctx)
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

func TestGCPLogFormatWritesCloudLoggingFields(t *testing.T) {
	t.Parallel()
	var traceID, spanID string
	lines := logLines(t, telemetry.Config{ServiceName: "billing", LogFormat: "gcp", ProjectID: "prod-1", LogLevel: "debug"},
		func(tel *telemetry.Telemetry, ctx context.Context) {
			tel.Logger.DebugContext(ctx, "polling")
			tel.Logger.InfoContext(ctx, "invoice issued", "work_order_id", "wo-1")
			tel.Logger.WarnContext(ctx, "lease lost")
			tel.Logger.ErrorContext(ctx, "database unavailable")
			tel.Logger.Info("no span here")
		})
	if len(lines) != 5 {
		t.Fatalf("%d lines, want 5: %v", len(lines), lines)
	}
	for i, want := range []string{"DEBUG", "INFO", "WARNING", "ERROR", "INFO"} {
		l := lines[i]
		if l["severity"] != want {
			t.Errorf("line %d severity %v, want %s: %v", i, l["severity"], want, l)
		}
		for _, gone := range []string{"level", "msg", "trace_id", "span_id"} {
			if _, ok := l[gone]; ok {
				t.Errorf("line %d has slog's %q; want Cloud Logging's field names only: %v", i, gone, l)
			}
		}
		if ts, _ := l["time"].(string); ts == "" {
			t.Errorf("line %d without time: %v", i, l)
		} else if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
			t.Errorf("line %d time %q is not RFC 3339: %v", i, ts, err)
		}
		src, _ := l["logging.googleapis.com/sourceLocation"].(map[string]any)
		if file, _ := src["file"].(string); !strings.HasSuffix(file, "logformat_test.go") || src["line"] == nil {
			t.Errorf("line %d sourceLocation %v; want this test file and a line", i, src)
		}
	}
	info := lines[1]
	if info["message"] != "invoice issued" || info["work_order_id"] != "wo-1" || info["service"] != "billing" {
		t.Errorf("info line %v lacks its message or attributes", info)
	}
	trace, _ := info["logging.googleapis.com/trace"].(string)
	traceID, found := strings.CutPrefix(trace, "projects/prod-1/traces/")
	if !found || len(traceID) != 32 {
		t.Errorf("trace field %q; want projects/prod-1/traces/<32 hex>", trace)
	}
	spanID, _ = info["logging.googleapis.com/spanId"].(string)
	if len(spanID) != 16 || info["logging.googleapis.com/trace_sampled"] != true {
		t.Errorf("span fields %v", info)
	}
	if _, ok := lines[4]["logging.googleapis.com/trace"]; ok {
		t.Errorf("a line logged without a span carries a trace: %v", lines[4])
	}
}

func TestGCPLogFormatWithoutAProjectFails(t *testing.T) {
	t.Parallel()
	_, err := telemetry.Setup(context.Background(), telemetry.Config{ServiceName: "x", LogFormat: "gcp"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "GOOGLE_CLOUD_PROJECT") {
		t.Fatalf("error %v; want one naming GOOGLE_CLOUD_PROJECT", err)
	}
}

// JSON stays the default format, with slog's names and the span's ids.
func TestDefaultLogFormatIsJSONWithTraceIDs(t *testing.T) {
	t.Parallel()
	lines := logLines(t, telemetry.Config{ServiceName: "x"},
		func(tel *telemetry.Telemetry, ctx context.Context) { tel.Logger.WarnContext(ctx, "hi") })
	l := lines[0]
	if l["level"] != "WARN" || l["msg"] != "hi" || l["trace_id"] == nil || l["span_id"] == nil {
		t.Fatalf("line %v; want slog JSON with trace_id and span_id", l)
	}
}

func TestTextLogFormat(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tel, err := telemetry.Setup(context.Background(), telemetry.Config{ServiceName: "x", LogFormat: "text"}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := sdktrace.NewTracerProvider().Tracer("t").Start(context.Background(), "op")
	tel.Logger.InfoContext(ctx, "hello there")
	span.End()
	want := `level=INFO msg="hello there" service=x trace_id=` + span.SpanContext().TraceID().String()
	if !strings.Contains(buf.String(), want) {
		t.Fatalf("text line %q; want it to contain %q", buf.String(), want)
	}
}

// countingValuer counts how often slog resolves it.
type countingValuer struct{ n *int }

func (c countingValuer) LogValue() slog.Value { *c.n++; return slog.StringValue("job-1") }

// A per-order logger.With costs nothing until a line passes the level (the
// per-order lines are DEBUG, off by default), and once it does, the lines
// carry the attributes in order, the With chain's and a group's included.
func TestWithAttributesAreEncodedOnlyForLinesWritten(t *testing.T) {
	t.Parallel()
	var resolved int
	lines := logLines(t, telemetry.Config{ServiceName: "x"}, func(tel *telemetry.Telemetry, ctx context.Context) {
		log := tel.Logger.With("job_id", countingValuer{&resolved}).With("attempt", 2)
		log.DebugContext(ctx, "job accepted")
		if resolved != 0 {
			t.Errorf("attributes of a With resolved %d times before any line was written; want 0", resolved)
		}
		log.InfoContext(ctx, "one", "k", "v")
		log.WarnContext(ctx, "two")
		log.WithGroup("g").InfoContext(ctx, "three", "k", "v")
	})
	if resolved != 1 {
		t.Errorf("attributes resolved %d times for three lines; want once", resolved)
	}
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3 (the DEBUG one is off): %v", len(lines), lines)
	}
	for i, l := range lines {
		if l["service"] != "x" || l["job_id"] != "job-1" || l["attempt"] != float64(2) {
			t.Errorf("line %d %v; want service, job_id and attempt from the With chain", i, l)
		}
	}
	if lines[0]["k"] != "v" || lines[0]["trace_id"] == nil {
		t.Errorf("line %v; want its own attribute and the trace id", lines[0])
	}
	if g, _ := lines[2]["g"].(map[string]any); g["k"] != "v" {
		t.Errorf("line %v; want k inside group g", lines[2])
	}
}
