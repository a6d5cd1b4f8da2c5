package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// TestServesProvisionedTopologyAndStopsOnCancel runs the emulator as the
// binary does, reaches it over gRPC like a service would, and checks that
// cancelling (SIGTERM) stops it and frees the port.
func TestServesProvisionedTopologyAndStopsOnCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := config{Listen: "127.0.0.1:0", Provision: true, ProjectID: "emulator-test"}
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, cfg, slog.New(slog.NewJSONHandler(io.Discard, nil)), func(a string) { addrc <- a })
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("serve returned early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("emulator not ready")
	}

	c, err := pubsub.NewClient(ctx, pubsub.ClientConfig{ProjectID: cfg.ProjectID, EmulatorHost: addr})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_, err = c.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{
		Subscription: pubsub.SubscriptionName(cfg.ProjectID, topology.SubWorkOrderCompleted),
	})
	if err != nil {
		t.Fatalf("provisioned subscription not served: %v", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("emulator did not stop")
	}
	// The port is free again: another emulator can bind it.
	srv, err := newServer(addr)
	if err != nil {
		t.Fatalf("port still held: %v", err)
	}
	_ = srv.Close()
}

func TestBusyAddressIsAnError(t *testing.T) {
	t.Parallel()
	srv, err := newServer("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	if _, err := newServer(srv.Addr); err == nil {
		t.Fatal("second server on a busy port started")
	}
}
