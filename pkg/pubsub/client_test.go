package pubsub_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
)

// fakeMetadataServer stands in for the GCE/GKE metadata server (through
// GCE_METADATA_HOST), answering the project id only to requests carrying
// the mandatory Metadata-Flavor header. project "" answers 404, as a
// metadata server that does not know it.
func fakeMetadataServer(t *testing.T, project string) {
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

// On an emulator with no project set, provisioning lands in
// "lossless-local", never in a project looked up on a metadata server.
func TestEmulatorWithoutProjectProvisionsIntoTheLocalProject(t *testing.T) {
	fakeMetadataServer(t, "must-not-be-used")
	emu := pubsubtest.New(t, pubsub.Topology{})
	ctx := context.Background()
	if err := pubsub.ProvisionCommand(ctx, pubsub.ClientConfig{EmulatorHost: emu.Addr}, testTopology(), discard()); err != nil {
		t.Fatal(err)
	}
	local, err := pubsub.NewClient(ctx, pubsub.ClientConfig{ProjectID: pubsub.DefaultProjectID, EmulatorHost: emu.Addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = local.Close() })
	if _, err := local.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: pubsub.TopicName(pubsub.DefaultProjectID, topicA)}); err != nil {
		t.Fatalf("topic %s not provisioned in %s: %v", topicA, pubsub.DefaultProjectID, err)
	}
}

func TestNoProjectOnRealPubSubFailsNamingTheVariable(t *testing.T) {
	t.Parallel()
	c, err := pubsub.NewClient(context.Background(), pubsub.ClientConfig{})
	if err == nil {
		_ = c.Close()
		t.Fatal("NewClient succeeded without any project id")
	}
	if !strings.Contains(err.Error(), "PUBSUB_PROJECT_ID") {
		t.Fatalf("error %v does not name PUBSUB_PROJECT_ID", err)
	}
}
