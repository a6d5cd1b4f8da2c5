package handoff_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/orderhop/orderhoptest"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// A handed-off order observes the handoff hop (created → HANDED_OFF) once,
// from its creation time; an order cancelled before its hand-off observes
// nothing.
func TestHandOffHopIsObservedForHandedOffOrdersOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	// The bundle's dispatcher, metered: same provider, same repository.
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	providerv1.RegisterProviderServiceServer(srv, b.provider)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	reader := sdkmetric.NewManualReader()
	completions, err := inbox.NewStore(b.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.dispatcher, err = handoff.NewDispatcher(providerv1.NewProviderServiceClient(conn), b.repo, completions, handoff.Config{},
		slog.New(slog.DiscardHandler), sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")); err != nil {
		t.Fatal(err)
	}

	before := time.Now()
	handed := b.createOrder(t)
	cancelled := b.createOrder(t)
	if _, err := b.repo.Update(context.Background(), cancelled, func(o *orders.Order) error { return o.Cancel("") }); err != nil {
		t.Fatal(err)
	}
	b.runRelay(t)
	b.waitEvent(t, handed, "PUBLISHED")
	b.waitEvent(t, cancelled, "PUBLISHED")
	if o := b.order(t, handed); o.Status != orders.StatusHandedOff {
		t.Fatalf("order %s", o.Status)
	}
	// The hop starts at the order's creation: within the test's own span.
	h := orderhoptest.Collect(t, reader)[orderhop.HandOff]
	if h.Count != 1 || h.Sum <= 0 || h.Sum > time.Since(before).Seconds() {
		t.Fatalf("handoff hop %+v, want one observation within the %v since the order's creation", h, time.Since(before))
	}
}
