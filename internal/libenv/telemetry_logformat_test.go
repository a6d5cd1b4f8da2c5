package libenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// logLines runs Setup with cfg and returns what one info line writes.
func logLines(t *testing.T, cfg telemetry.Config) []map[string]any {
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
	tel.Logger.InfoContext(ctx, "hi")
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

// On GKE nothing sets the project: the trace field gets the metadata
// server's.
func TestGCPLogFormatTakesTheProjectFromTheMetadataServer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" || r.URL.Path != "/computeMetadata/v1/project/project-id" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Metadata-Flavor", "Google")
		_, _ = w.Write([]byte("gke-project"))
	}))
	t.Cleanup(srv.Close)
	t.Setenv("GCE_METADATA_HOST", strings.TrimPrefix(srv.URL, "http://"))
	cfg, err := libenv.ResolveTelemetryProject(context.Background(), telemetry.Config{ServiceName: "x", LogFormat: "gcp"})
	if err != nil {
		t.Fatal(err)
	}
	lines := logLines(t, cfg)
	if trace, _ := lines[0]["logging.googleapis.com/trace"].(string); !strings.HasPrefix(trace, "projects/gke-project/traces/") {
		t.Fatalf("trace field %q; want the metadata server's project", trace)
	}
}

func TestGCPLogFormatWithoutAnyProjectFails(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	t.Setenv("GCE_METADATA_HOST", strings.TrimPrefix(srv.URL, "http://"))
	_, err := libenv.ResolveTelemetryProject(context.Background(), telemetry.Config{ServiceName: "x", LogFormat: "gcp"})
	if err == nil || !strings.Contains(err.Error(), "GOOGLE_CLOUD_PROJECT") {
		t.Fatalf("error %v; want one naming GOOGLE_CLOUD_PROJECT", err)
	}
}
