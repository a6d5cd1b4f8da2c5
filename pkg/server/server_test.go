package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// fakeOrders is a minimal service to exercise the shared plumbing: it
// counts the calls that reached it and echoes the order.
type fakeOrders struct {
	testpb.UnimplementedOrderServiceServer
	calls atomic.Int32
}

func (f *fakeOrders) PutOrder(_ context.Context, r *testpb.PutOrderRequest) (*testpb.PutOrderResponse, error) {
	f.calls.Add(1)
	return &testpb.PutOrderResponse{Order: r.GetOrder()}, nil
}

// validOrder is a request every field rule accepts, over gRPC and as the
// REST body of PUT /v1/orders (validOrderJSON).
func validOrder() *testpb.PutOrderRequest {
	return &testpb.PutOrderRequest{Order: &testpb.Order{CustomerId: "c1", Quantity: 1}}
}

const validOrderJSON = `{"customer_id": "c1", "quantity": 1}`

type bundle struct {
	srv    *server.Server
	fake   *fakeOrders
	cancel context.CancelFunc
	done   chan error
	base   string
	logs   *logBuffer // everything the server logged
}

// logBuffer is an io.Writer safe for the server's concurrent log writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func setup(t *testing.T, opts ...server.Option) *bundle {
	t.Helper()
	return setupWith(t, server.Config{}, opts...)
}

// setupWith is setup with listener and limit settings from cfg; its
// addresses and shutdown timeout are the test's.
func setupWith(t *testing.T, cfg server.Config, opts ...server.Option) *bundle {
	t.Helper()
	b := startWith(t, cfg, opts...)
	waitfor.Condition(t, 5*time.Second, "server ready", func() bool {
		resp, err := http.Get(b.base + "/readyz") //nolint:noctx // test
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return b
}

func start(t *testing.T, opts ...server.Option) *bundle {
	t.Helper()
	return startWith(t, server.Config{}, opts...)
}

func startWith(t *testing.T, cfg server.Config, opts ...server.Option) *bundle {
	t.Helper()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.ShutdownTimeout = "127.0.0.1:0", "127.0.0.1:0", 5*time.Second
	logs := &logBuffer{}
	srv, err := server.New(cfg, slog.New(slog.NewTextHandler(logs, nil)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeOrders{}
	testpb.RegisterOrderServiceServer(srv.GRPC(), fake)
	ctx, cancel := context.WithCancel(context.Background())
	if err := testpb.RegisterOrderServiceHandler(ctx, srv.Gateway(), srv.GatewayConn()); err != nil {
		t.Fatal(err)
	}
	b := &bundle{srv: srv, fake: fake, cancel: cancel, done: make(chan error, 1), base: "http://" + srv.HTTPAddr(), logs: logs}
	go func() { b.done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-b.done; err != nil {
			t.Logf("server stopped with: %v", err)
		}
	})
	return b
}

func TestInvalidRequestIsRejectedWithFieldViolationsOverGRPCAndHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)

	conn, err := grpc.NewClient(b.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = testpb.NewOrderServiceClient(conn).PutOrder(context.Background(), &testpb.PutOrderRequest{
		Order: &testpb.Order{CustomerId: "c1", Quantity: 1, Discount: 1.5, UnitPrice: &testpb.Amount{CurrencyCode: "EUR", MinorUnits: -1}},
	})
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("code = %v, want INVALID_ARGUMENT", st.Code())
	}
	fields := map[string]bool{}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields[v.GetField()] = true
			}
		}
	}
	if !fields["order.discount"] || !fields["order.unit_price.minor_units"] || len(fields) != 2 {
		t.Fatalf("field violations = %v, want order.discount and order.unit_price.minor_units", fields)
	}

	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, b.base+"/v1/orders", strings.NewReader(`{"customer_id": "c1", "quantity": 1, "discount": 1.5}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "order.discount") {
		t.Fatalf("HTTP %d %s, want 400 naming order.discount", resp.StatusCode, body)
	}
	if n := b.fake.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times on invalid input", n)
	}
}

func TestIdempotencyKeyMismatchIsHTTP422(t *testing.T) {
	t.Parallel()
	b := setup(t, failWith(apierror.FailedPrecondition(apierror.ReasonIdempotencyKeyMismatch, "key reused with a different body")))
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, b.base+"/v1/orders", strings.NewReader(validOrderJSON))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&st)
	if resp.StatusCode != http.StatusUnprocessableEntity || st.Code != int(codes.FailedPrecondition) {
		t.Fatalf("HTTP %d (grpc code %d), want 422 with FAILED_PRECONDITION body", resp.StatusCode, st.Code)
	}
}

// The opentelemetry-demo trap: Serve blocking before the shutdown code. Here a
// worker with in-flight work must finish it, readiness must drop, and Run must
// return nil.
func TestGracefulShutdownFinishesInFlightWorkAndStopsServing(t *testing.T) {
	t.Parallel()
	inFlight := make(chan struct{})
	release := make(chan struct{})
	var finished, claimedAfterStop atomic.Bool
	worker := func(ctx context.Context) error {
		close(inFlight)
		<-release // in-flight work, not interruptible by ctx
		finished.Store(true)
		<-ctx.Done()
		if ctx.Err() == nil {
			claimedAfterStop.Store(true)
		}
		return nil
	}
	b := setup(t, server.WithWorker("test", worker))
	<-inFlight

	conn, err := grpc.NewClient(b.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	if r, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before shutdown: %v %v", r, err)
	}

	b.cancel()
	waitfor.Condition(t, 5*time.Second, "readiness drops during shutdown", func() bool {
		resp, err := http.Get(b.base + "/readyz") //nolint:noctx // test
		if err != nil {
			return true // listener already closed
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	select {
	case err := <-b.done:
		t.Fatalf("Run returned (%v) before in-flight work finished", err)
	default:
	}
	close(release)
	var runErr error
	waitfor.Condition(t, 5*time.Second, "Run returns", func() bool {
		select {
		case runErr = <-b.done:
			b.done <- runErr // for cleanup
			return true
		default:
			return false
		}
	})
	if runErr != nil {
		t.Fatalf("Run: %v", runErr)
	}
	if !finished.Load() || claimedAfterStop.Load() {
		t.Fatalf("finished=%v claimedAfterStop=%v", finished.Load(), claimedAfterStop.Load())
	}
}

func TestFailingWorkerStopsTheProcess(t *testing.T) {
	t.Parallel()
	boom := errors.New("relay lost its database")
	b := start(t, server.WithWorker("relay", func(context.Context) error { return boom }))
	var runErr error
	waitfor.Condition(t, 5*time.Second, "Run returns after worker failure", func() bool {
		select {
		case runErr = <-b.done:
			b.done <- runErr
			return true
		default:
			return false
		}
	})
	if !errors.Is(runErr, boom) {
		t.Fatalf("Run error = %v, want the worker's error", runErr)
	}
}
