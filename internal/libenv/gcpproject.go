package libenv

// The Google Cloud project a process runs in, from the GCE/GKE metadata
// server, for settings that default to "this project" (the Pub/Sub project,
// the project of Cloud Logging's trace field). The libraries take the
// project as a value; the services resolve it here.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/compute/metadata"
)

// MetadataTimeout bounds ProjectFromMetadata, retries included. Off Google Cloud
// nothing answers and the caller waits this long before failing; on GKE the
// metadata server answers in milliseconds, but may need a few retries in the
// first seconds of a pod (Workload Identity starting up).
const MetadataTimeout = 5 * time.Second

// ProjectFromMetadata returns the project id the metadata server reports. The server
// is http://169.254.169.254, or GCE_METADATA_HOST when set (how the metadata
// library lets tests and emulators stand in for it).
func ProjectFromMetadata(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, MetadataTimeout)
	defer cancel()
	// A client of our own and GetWithContext rather than the library's
	// ProjectIDWithContext, whose answer is cached for the whole process.
	c := metadata.NewWithOptions(&metadata.Options{})
	id, err := c.GetWithContext(ctx, "project/project-id")
	if err != nil {
		return "", fmt.Errorf("metadata server: project id: %w", err)
	}
	id = strings.TrimSpace(id)
	if id == "" {
		return "", fmt.Errorf("metadata server: empty project id")
	}
	return id, nil
}
