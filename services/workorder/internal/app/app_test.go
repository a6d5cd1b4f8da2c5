package app_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/app"
	"github.com/lossless-dev/lossless/services/workorder/internal/config"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// blockingProvider accepts every order, but holds each call until released.
type blockingProvider struct {
	providerv1.UnimplementedProviderServiceServer
	called  chan string
	release chan struct{}
	calls   atomic.Int32
}

func (p *blockingProvider) SubmitWorkOrder(_ context.Context, req *providerv1.SubmitWorkOrderRequest) (*providerv1.SubmitWorkOrderResponse, error) {
	p.calls.Add(1)
	p.called <- req.GetWorkOrderId()
	<-p.release
	return &providerv1.SubmitWorkOrderResponse{Acceptance: &providerv1.Acceptance{JobId: "job-1", WorkOrderId: req.GetWorkOrderId()}, Created: true}, nil
}

func startProvider(t *testing.T, p providerv1.ProviderServiceServer) string {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	providerv1.RegisterProviderServiceServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func testConfig(t *testing.T, dsn, providerAddr string) config.Config {
	em := pubsubtest.New(t, declaredtest.Topology(t))
	return config.Config{
		Common: serviceapp.Common{
			PubSub:    pubsub.ClientConfig{ProjectID: em.ProjectID, EmulatorHost: em.Addr},
			Database:  pgdb.Config{URL: dsn},
			Server:    server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminGRPCAddr: "127.0.0.1:0", AdminHTTPAddr: "127.0.0.1:0", ShutdownTimeout: 10 * time.Second},
			Telemetry: telemetry.Config{ServiceName: config.ServiceName, LogLevel: "info"},
			// Caller authentication is tested in package api and by the stack
			// tests (internal/devtools/localstack); here every caller is anonymous.
			Auth: libenv.CallerAuth{Disabled: true},
		},
		ProviderAddr: providerAddr,
		HandOff:      handoff.Config{Deadline: 5 * time.Second},
		Outbox:       outbox.Config{PollInterval: 20 * time.Millisecond, SweepInterval: 20 * time.Millisecond},
		Idempotency:  idempotency.Config{},
		ProviderAuth: clientauth.Config{Disabled: true},
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Shutdown of `serve` (SIGTERM = ctx cancelled) while a hand-off is in flight:
// the in-flight hand-off completes and is recorded, and nothing new is
// claimed: an event committed after the shutdown began stays PENDING for the
// next process.
func TestServeShutdown_InFlightHandOffFinishesAndNoNewWorkIsClaimed(t *testing.T) {
	t.Parallel()
	// As the runtime role, as deployed: the grants must suffice.
	_, dsn := pgtest.RuntimeRole(t, pgtest.NewDatabase(t, migrations.WorkOrder()...), migrations.WorkOrder()...)
	provider := &blockingProvider{called: make(chan string, 2), release: make(chan struct{})}
	cfg := testConfig(t, dsn, startProvider(t, provider))

	a, err := app.New(context.Background(), cfg, slog.New(slog.DiscardHandler), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	base := "http://" + a.HTTPAddr()
	waitfor.Condition(t, 10*time.Second, "readyz 200", func() bool { code, _ := get(t, base+"/readyz"); return code == http.StatusOK })
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz %d", code)
	}

	// A real create through the REST gateway.
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/v1/work-orders",
		strings.NewReader(`{"customer_id":"acme","description":"paint","positions":2,"unit_price":{"currency_code":"EUR","minor_units":100}}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("create: HTTP %d: %s", resp.StatusCode, body)
	}
	var created workorderv1.CreateWorkOrderResponse
	if err := protojson.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	first := uuid.MustParse(created.GetWorkOrder().GetId())

	// The relay is now inside the provider call.
	select {
	case id := <-provider.called:
		if id != first.String() {
			t.Fatalf("provider called for %s, want %s", id, first)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("provider not called")
	}

	// SIGTERM. Once the HTTP listener is closed, the workers' context has
	// been cancelled (pkg/server cancels workers before draining listeners).
	cancel()
	waitfor.Condition(t, 10*time.Second, "HTTP listener closed", func() bool {
		conn, err := (&net.Dialer{}).DialContext(context.Background(), "tcp", a.HTTPAddr())
		if err == nil {
			_ = conn.Close()
			return false
		}
		return true
	})

	// A second order commits after shutdown began.
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	second, _ := orders.New("acme", "late", 1, orders.Money{CurrencyCode: "EUR", MinorUnits: 1})
	if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := orders.InTx(tx).Create(context.Background(), second)
		return err
	}); err != nil {
		t.Fatal(err)
	}

	close(provider.release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v, want nil (clean shutdown)", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not return after shutdown")
	}

	state := func(id uuid.UUID) (order, event string) {
		t.Helper()
		if err := pool.QueryRow(context.Background(), `
SELECT o.status, e.status FROM work_orders o JOIN outbox_events e ON e.aggregate_id = o.id::text WHERE o.id = $1`, id).
			Scan(&order, &event); err != nil {
			t.Fatal(err)
		}
		return order, event
	}
	if o, e := state(first); o != "HANDED_OFF" || e != "PUBLISHED" {
		t.Fatalf("in-flight order: %s / event %s, want HANDED_OFF / PUBLISHED", o, e)
	}
	var waiting int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM waiting_points WHERE work_order_id = $1`, first).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	if waiting != 1 {
		t.Fatalf("waiting points = %d, want 1", waiting)
	}
	if o, e := state(second.ID); o != "CREATED" || e != "PENDING" {
		t.Fatalf("order committed after shutdown: %s / event %s, want CREATED / PENDING", o, e)
	}
	if n := provider.calls.Load(); n != 1 {
		t.Fatalf("provider calls = %d, want 1", n)
	}
}

func TestNewFailsFastOnAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	// A port nobody listens on: bind one, then close it.
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = app.New(ctx, testConfig(t, "postgres://u@"+addr+"/db?connect_timeout=2", "127.0.0.1:1"), slog.New(slog.DiscardHandler), telemetry.Providers{})
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("err = %v, want an error naming DATABASE_URL", err)
	}
}

// operatorToken is long enough for operator.MinTokenLength.
const operatorToken = "s3cret-operator-token-of-32-chars"

// The operator token is checked before request validation: a caller without
// the token learns nothing about its request, even an invalid one.
func TestAdminRefusesMissingTokenBeforeValidating(t *testing.T) {
	t.Parallel()
	// As the runtime role, as deployed: the grants must suffice.
	_, dsn := pgtest.RuntimeRole(t, pgtest.NewDatabase(t, migrations.WorkOrder()...), migrations.WorkOrder()...)
	cfg := testConfig(t, dsn, startProvider(t, &blockingProvider{called: make(chan string, 1), release: make(chan struct{})}))
	cfg.OperatorToken = operatorToken
	a, err := app.New(context.Background(), cfg, slog.New(slog.DiscardHandler), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	conn, err := grpc.NewClient(a.AdminGRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	admin := workorderv1.NewWorkOrderAdminServiceClient(conn)
	invalid := &workorderv1.RecordReHandOffRequest{WorkOrderId: "not-a-uuid"} // no ticket, no actor, bad id
	waitfor.Condition(t, 10*time.Second, "server up", func() bool {
		_, err := admin.RecordReHandOff(context.Background(), invalid)
		return status.Code(err) != codes.Unavailable
	})
	if _, err := admin.RecordReHandOff(context.Background(), invalid); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want UNAUTHENTICATED", err)
	}
	authed := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+operatorToken))
	if _, err := admin.RecordReHandOff(authed, invalid); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("with the token an invalid request is INVALID_ARGUMENT, got %v", err)
	}
}

// apiMaxConns is the API pool of TestAPIFloodDoesNotStarveTheOutboxRelay.
const apiMaxConns = 3

// A flood of API requests stuck on the database (here: every create waits
// for a table lock) takes at most the API pool's connections; the outbox
// relay still claims and hands off a new order on the workers' pool.
func TestAPIFloodDoesNotStarveTheOutboxRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// As the runtime role, as deployed: the grants must suffice.
	_, dsn := pgtest.RuntimeRole(t, pgtest.NewDatabase(t, migrations.WorkOrder()...), migrations.WorkOrder()...)
	provider := &blockingProvider{called: make(chan string, 64), release: make(chan struct{})}
	close(provider.release)
	cfg := testConfig(t, dsn, startProvider(t, provider))
	// The flood waits on a lock for as long as the server lets a request run.
	cfg.Database.APIMaxConns, cfg.Database.LockTimeout, cfg.Database.StatementTimeout = apiMaxConns, time.Minute, 2*time.Minute
	a, err := app.New(ctx, cfg, slog.New(slog.DiscardHandler), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Every keyed create inserts into idempotency_keys: a SHARE lock makes
	// each of them hold its connection while it waits.
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, "LOCK TABLE idempotency_keys IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	client := workorderv1.NewWorkOrderServiceClient(conn)
	flood, cancelFlood := context.WithCancel(ctx)
	var floodDone sync.WaitGroup
	t.Cleanup(func() {
		cancelFlood()
		_ = lock.Rollback(ctx)
		floodDone.Wait()
		_ = conn.Close()
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	const clients = 30 // more than any pool of the service
	for range clients {
		floodDone.Go(func() {
			for flood.Err() == nil {
				rctx := metadata.AppendToOutgoingContext(flood, idempotency.MetadataKey, uuid.NewString())
				_, _ = client.CreateWorkOrder(rctx, &workorderv1.CreateWorkOrderRequest{WorkOrder: &workorderv1.WorkOrder{
					CustomerId: "acme", Description: "flood", Positions: 1, UnitPrice: &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 1}}})
			}
		})
	}
	waiting := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO %.idempotency_keys %'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitfor.Condition(t, 20*time.Second, "API pool saturated by the flood", func() bool { return waiting() >= apiMaxConns })

	order, _ := orders.New("acme", "during the flood", 1, orders.Money{CurrencyCode: "EUR", MinorUnits: 1})
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := orders.InTx(tx).Create(ctx, order)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Within half the server's request timeout: the flood's requests keep
	// their connections that long, so a relay that needs one of them fails.
	waitfor.Condition(t, server.DefaultRequestTimeout/2, "order handed off during the API flood", func() bool {
		var st string
		if err := pool.QueryRow(ctx, `SELECT status FROM work_orders WHERE id = $1`, order.ID).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st == "HANDED_OFF"
	})
	if n := waiting(); n > apiMaxConns {
		t.Fatalf("%d API requests hold a connection, want at most the API pool's %d", n, apiMaxConns)
	}
}
