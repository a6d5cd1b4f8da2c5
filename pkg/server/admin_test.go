package server_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// adminBundle is a server whose only gRPC service (the test's OrderService,
// standing in for an operator service) is registered on the admin server.
type adminBundle struct {
	srv  *server.Server
	fake *fakeOrders
	done chan error
	stop context.CancelFunc
}

func startAdmin(t *testing.T, cfg server.Config) *adminBundle {
	t.Helper()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.ShutdownTimeout = "127.0.0.1:0", "127.0.0.1:0", 5*time.Second
	cfg.AdminGRPCAddr, cfg.AdminHTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	srv, err := server.New(cfg, slog.New(slog.DiscardHandler),
		server.WithAdminHTTPHandler("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("m\n")) })))
	if err != nil {
		t.Fatal(err)
	}
	b := &adminBundle{srv: srv, fake: &fakeOrders{}, done: make(chan error, 1)}
	testpb.RegisterOrderServiceServer(srv.AdminGRPC(), b.fake)
	ctx, cancel := context.WithCancel(context.Background())
	b.stop = cancel
	if err := testpb.RegisterOrderServiceHandler(ctx, srv.AdminGateway(), srv.AdminGatewayConn()); err != nil {
		t.Fatal(err)
	}
	go func() { b.done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-b.done; err != nil {
			t.Logf("Run: %v", err) // the test checks Run's error where it matters
		}
	})
	waitfor.Condition(t, 5*time.Second, "server ready", func() bool {
		resp, err := http.Get("http://" + srv.HTTPAddr() + "/readyz") //nolint:noctx // test
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return b
}

func putOrderGRPC(t *testing.T, addr string, req *testpb.PutOrderRequest) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = testpb.NewOrderServiceClient(conn).PutOrder(ctx, req)
	return err
}

func TestAdminServicesAreServedOnTheAdminListenersOnly(t *testing.T) {
	t.Parallel()
	b := startAdmin(t, server.Config{})
	public, admin := "http://"+b.srv.HTTPAddr(), "http://"+b.srv.AdminHTTPAddr()

	if err := putOrderGRPC(t, b.srv.GRPCAddr(), validOrder()); status.Code(err) != codes.Unimplemented {
		t.Fatalf("admin RPC on the public gRPC port: %v, want UNIMPLEMENTED", err)
	}
	if code := putOrder(t, public); code != http.StatusNotFound {
		t.Fatalf("admin REST call on the public HTTP port = %d, want 404", code)
	}
	if n := b.fake.calls.Load(); n != 0 {
		t.Fatalf("the public listeners reached the admin service %d times", n)
	}
	if err := putOrderGRPC(t, b.srv.AdminGRPCAddr(), validOrder()); err != nil {
		t.Fatalf("admin RPC on the admin gRPC port: %v", err)
	}
	if code := putOrder(t, admin); code != http.StatusOK {
		t.Fatalf("admin REST call on the admin HTTP port = %d, want 200", code)
	}
	if n := b.fake.calls.Load(); n != 2 {
		t.Fatalf("admin service calls = %d, want 2", n)
	}
	// The same interceptors: request validation runs on the admin server.
	bad := &testpb.PutOrderRequest{Order: &testpb.Order{CustomerId: "c1", Quantity: 1, Discount: 1.5}}
	if err := putOrderGRPC(t, b.srv.AdminGRPCAddr(), bad); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("invalid admin request: %v, want INVALID_ARGUMENT", err)
	}
	for url, want := range map[string]int{
		public + "/metrics": 404, admin + "/metrics": 200,
		public + "/healthz": 200, public + "/readyz": 200,
		admin + "/healthz": 404, admin + "/readyz": 404,
	} {
		if code := httpStatus(t, url); code != want {
			t.Errorf("GET %s = %d, want %d", url, code, want)
		}
	}
}

// Operators repair through worker replicas too: the admin listeners run
// where the public gRPC listener does not.
func TestRoleWorkerServesTheAdminListeners(t *testing.T) {
	t.Parallel()
	b := startAdmin(t, server.Config{Role: server.RoleWorker})
	if addr := b.srv.GRPCAddr(); addr != "" {
		t.Fatalf("public gRPC bound at %s in role worker", addr)
	}
	if err := putOrderGRPC(t, b.srv.AdminGRPCAddr(), validOrder()); err != nil {
		t.Fatalf("admin RPC in role worker: %v", err)
	}
	if code := putOrder(t, "http://"+b.srv.AdminHTTPAddr()); code != http.StatusOK {
		t.Fatalf("admin REST call in role worker = %d, want 200", code)
	}
	if code := httpStatus(t, "http://"+b.srv.AdminHTTPAddr()+"/metrics"); code != http.StatusOK {
		t.Fatalf("admin /metrics in role worker = %d", code)
	}
}

func TestShutdownClosesTheAdminListeners(t *testing.T) {
	t.Parallel()
	b := startAdmin(t, server.Config{})
	grpcAddr, httpAddr := b.srv.AdminGRPCAddr(), b.srv.AdminHTTPAddr()
	b.stop()
	if err := <-b.done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	b.done <- nil // for the cleanup
	for _, addr := range []string{grpcAddr, httpAddr} {
		d := net.Dialer{Timeout: time.Second}
		if c, err := d.DialContext(t.Context(), "tcp", addr); err == nil {
			_ = c.Close()
			t.Errorf("%s still accepts connections after shutdown", addr)
		}
	}
}

func TestAdminAddressesMustDifferFromTheOthers(t *testing.T) {
	t.Parallel()
	for _, cfg := range []server.Config{
		{GRPCAddr: ":9090", HTTPAddr: ":8080", AdminGRPCAddr: ":9090", AdminHTTPAddr: ":8180"},
		{GRPCAddr: ":9090", HTTPAddr: ":8080", AdminGRPCAddr: ":9190", AdminHTTPAddr: ":8080"},
		{GRPCAddr: ":9090", HTTPAddr: ":8080", AdminGRPCAddr: ":9190", AdminHTTPAddr: ":9190"},
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "is also the") {
			t.Errorf("%+v: err = %v, want the clash named", cfg, err)
		}
	}
	ok := server.Config{GRPCAddr: ":9090", HTTPAddr: ":8080", AdminGRPCAddr: ":9190", AdminHTTPAddr: ":8180"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("distinct addresses: %v", err)
	}
}
