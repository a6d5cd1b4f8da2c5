package libenv_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/libenv"
)

// fakeMetadataServer answers the project id like the GCE/GKE metadata server,
// only to requests carrying its mandatory Metadata-Flavor header.
func fakeMetadataServer(t *testing.T, project string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" || r.URL.Path != "/computeMetadata/v1/project/project-id" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Metadata-Flavor", "Google")
		_, _ = w.Write([]byte(project))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestProjectIDComesFromTheMetadataServer(t *testing.T) {
	t.Setenv("GCE_METADATA_HOST", fakeMetadataServer(t, "prod-project-1"))
	got, err := libenv.ProjectFromMetadata(context.Background())
	if err != nil || got != "prod-project-1" {
		t.Fatalf("ProjectFromMetadata = %q, %v; want prod-project-1", got, err)
	}
}

func TestNoMetadataServerIsAnError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	t.Setenv("GCE_METADATA_HOST", strings.TrimPrefix(srv.URL, "http://"))
	if got, err := libenv.ProjectFromMetadata(context.Background()); err == nil {
		t.Fatalf("ProjectFromMetadata = %q; want an error when the server does not know the project", got)
	}
}
