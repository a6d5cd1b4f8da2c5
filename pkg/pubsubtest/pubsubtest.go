// Package pubsubtest gives a test a real Pub/Sub gRPC endpoint: the pstest
// fake from cloud.google.com/go/pubsub/v2 served on a loopback port, with
// a topology provisioned. Tests talk to it through the same client
// code as production (never an in-memory stub of the client), and can hand
// Addr to a child process as PUBSUB_EMULATOR_HOST.
//
// Lesson: test messaging against a real gRPC endpoint, so acks, nacks,
// redeliveries and ordering keys behave as the client sees them. It guards no
// failure mode itself: the Pub/Sub side of F4, F10, F16 and H4's tests runs
// on it.
package pubsubtest

import (
	"context"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// ProjectID is the project every Emulator uses; each Emulator is its own
// server, so tests do not share state.
const ProjectID = "lossless-test"

// Emulator is a running fake plus a client connected to it.
type Emulator struct {
	Addr      string // "127.0.0.1:port"
	Client    *gpubsub.Client
	ProjectID string
	// Server gives tests pstest's hooks (Messages, ClearMessages,
	// SetTimeNowFunc). Behaviour that differs from real Pub/Sub is listed in
	// docs/adr/0004-pubsub-emulator.md.
	Server *pstest.Server
}

// New starts a fake on 127.0.0.1 (free port), provisions topo on it and
// stops everything at t.Cleanup. A pattern package's tests pass a topology of
// their own; a service's tests pass the system's.
func New(t testing.TB, topo pubsub.Topology, opts ...pstest.ServerReactorOption) *Emulator {
	t.Helper()
	srv := pstest.NewServerWithAddress("127.0.0.1:0", opts...)
	t.Cleanup(func() { _ = srv.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pubsub.NewClient(ctx, pubsub.ClientConfig{ProjectID: ProjectID, EmulatorHost: srv.Addr})
	if err != nil {
		t.Fatalf("pubsubtest: client: %v", err)
	}
	// Registered after the server's cleanup, so it runs before it.
	t.Cleanup(func() { _ = c.Close() })
	if _, err := pubsub.Provision(ctx, c, topo); err != nil {
		t.Fatalf("pubsubtest: provision: %v", err)
	}
	return &Emulator{Addr: srv.Addr, Client: c, ProjectID: ProjectID, Server: srv}
}
