package app_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/app"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
)

// roleLogs collects a replica's JSON log lines.
type roleLogs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *roleLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *roleLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startSimRole runs the simulator in role r until the test ends and waits
// until it is ready; the returned logs are its own.
func startSimRole(t *testing.T, cfg app.Config, r server.Role) (*app.App, *roleLogs) {
	t.Helper()
	cfg.Server.Role = r
	logs := &roleLogs{}
	a, err := app.New(context.Background(), cfg, slog.New(slog.NewJSONHandler(logs, nil)), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("role %s: Run: %v", r, err)
		}
	})
	waitfor.Condition(t, 10*time.Second, string(r)+" ready", func() bool {
		return roleRequest(t, http.MethodGet, "http://"+a.HTTPAddr()+"/readyz", "") == http.StatusOK
	})
	return a, logs
}

func roleRequest(t *testing.T, method, url, body string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// An api replica accepts the hand-off and runs no engine: the job stays
// ACCEPTED and no completion is published. A worker replica on the same
// database serves no API (no gRPC listener, REST 404) and its engine runs the
// job to DONE, publishing the completion.
func TestRoles_APIAcceptsAndRunsNoEngine_WorkerRunsTheEngineAndServesNoAPI(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t, migrations.ProviderSim()...)
	emu := pubsubtest.New(t, topology.System())
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg := app.Config{
		DatabaseURL: dsn,
		Server:      server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second},
		PubSub:      pubsub.ClientConfig{ProjectID: emu.ProjectID, EmulatorHost: emu.Addr},
		Engine: engine.Config{
			Workers: 2, PollInterval: 20 * time.Millisecond, Lease: time.Second,
			ExecBase: time.Millisecond, ExecPerPosition: time.Microsecond, NoJitter: true,
		},
	}
	jobStatus := func(id string) string {
		var s string
		if err := pool.QueryRow(context.Background(), `SELECT status FROM jobs WHERE work_order_id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	apiApp, apiLogs := startSimRole(t, cfg, server.RoleAPI)
	conn, err := grpc.NewClient(apiApp.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	id := uuid.NewString()
	if _, err := providerv1.NewProviderServiceClient(conn).SubmitWorkOrder(context.Background(), &providerv1.SubmitWorkOrderRequest{
		WorkOrderId: id, CustomerId: "c-1", Positions: 1,
	}); err != nil {
		t.Fatalf("hand-off to the api replica: %v", err)
	}
	// The server logged how many loops it started: none, by construction.
	if !strings.Contains(apiLogs.String(), `"role":"api"`) || !strings.Contains(apiLogs.String(), `"workers":0`) {
		t.Fatalf("api replica's serving line does not say role api with 0 workers:\n%s", apiLogs.String())
	}
	if st := jobStatus(id); st != "ACCEPTED" {
		t.Fatalf("job %s with only the api replica running; want ACCEPTED", st)
	}
	if msgs := emu.Server.Messages(); len(msgs) != 0 {
		t.Fatalf("%d completions published with only the api replica running; want none", len(msgs))
	}

	workerApp, _ := startSimRole(t, cfg, server.RoleWorker)
	if addr := workerApp.GRPCAddr(); addr != "" {
		t.Fatalf("worker replica bound gRPC at %s", addr)
	}
	wbase := "http://" + workerApp.HTTPAddr()
	if code := roleRequest(t, http.MethodPost, wbase+"/v1/jobs", `{"workOrderId":"`+uuid.NewString()+`","customerId":"c-1","positions":1}`); code != http.StatusNotFound {
		t.Fatalf("worker replica POST /v1/jobs = %d, want 404 (no REST API)", code)
	}
	if code := roleRequest(t, http.MethodGet, wbase+"/healthz", ""); code != http.StatusOK {
		t.Fatalf("worker /healthz = %d", code)
	}
	waitfor.Value(t, 15*time.Second, "the worker replica runs the job", "DONE", func() string { return jobStatus(id) })
	published := false
	for _, m := range emu.Server.Messages() {
		published = published || bytes.Contains(m.Data, []byte(id))
	}
	if !published {
		t.Fatalf("job DONE but no completion for %s published", id)
	}
	if n := countJobs(t, pool); n != 1 {
		t.Fatalf("%d jobs; the worker replica's REST accepted a hand-off", n)
	}
}

func countJobs(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
