package libenv_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// fakePubSubMetadataServer stands in for the GCE/GKE metadata server
// (through GCE_METADATA_HOST); project "" answers 404, as a metadata server
// that does not know it.
func fakePubSubMetadataServer(t *testing.T, project string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if project == "" || r.Header.Get("Metadata-Flavor") != "Google" || r.URL.Path != "/computeMetadata/v1/project/project-id" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Metadata-Flavor", "Google")
		_, _ = w.Write([]byte(project))
	}))
	t.Cleanup(srv.Close)
	t.Setenv("GCE_METADATA_HOST", strings.TrimPrefix(srv.URL, "http://"))
}

func TestPubSubProjectPrefersPubSubProjectThenGoogleCloudProject(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"PUBSUB_PROJECT_ID": "ps", "GOOGLE_CLOUD_PROJECT": "gcp"}, "ps"},
		{map[string]string{"GOOGLE_CLOUD_PROJECT": "gcp"}, "gcp"},
		{map[string]string{"PUBSUB_EMULATOR_HOST": "localhost:8085"}, "lossless-local"},
		{map[string]string{"PUBSUB_EMULATOR_HOST": "localhost:8085", "GOOGLE_CLOUD_PROJECT": "gcp"}, "gcp"},
		// None: left for NewClient to find on the metadata server.
		{map[string]string{}, ""},
	} {
		r := envconfig.FromMap(tc.env)
		cfg := libenv.PubSub(r)
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		if cfg.ProjectID != tc.want {
			t.Errorf("env %v: project %q, want %q", tc.env, cfg.ProjectID, tc.want)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("env %v: Validate: %v", tc.env, err)
		}
	}
}

// On GKE nothing sets the project: it comes from the metadata server.
func TestProjectIDResolvedFromTheMetadataServer(t *testing.T) {
	fakePubSubMetadataServer(t, "prod-project-7")
	got, err := libenv.ResolvePubSubProject(context.Background(), pubsub.ClientConfig{})
	if err != nil || got.ProjectID != "prod-project-7" {
		t.Fatalf("ResolvePubSubProject = %q, %v; want prod-project-7", got.ProjectID, err)
	}
	// An explicit project wins over the metadata server.
	if got, _ := libenv.ResolvePubSubProject(context.Background(), pubsub.ClientConfig{ProjectID: "explicit"}); got.ProjectID != "explicit" {
		t.Fatalf("ResolvePubSubProject = %q; want the configured project", got.ProjectID)
	}
}

func TestNoProjectAnywhereFailsNamingTheVariable(t *testing.T) {
	fakePubSubMetadataServer(t, "")
	c, err := libenv.PubSubClient(context.Background(), pubsub.ClientConfig{})
	if err == nil {
		_ = c.Close()
		t.Fatal("NewClient succeeded without any project id")
	}
	if !strings.Contains(err.Error(), "PUBSUB_PROJECT_ID") {
		t.Fatalf("error %v does not name PUBSUB_PROJECT_ID", err)
	}
}
