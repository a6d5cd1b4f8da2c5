package app_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/app"
	"github.com/lossless-dev/lossless/services/workorder/internal/config"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
)

// syncBuffer collects a process's JSON log lines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startRole runs the app with cfg in role r until the test ends and waits
// until it is ready; the returned buffer holds its logs.
func startRole(t *testing.T, cfg config.Config, r server.Role) (*app.App, *syncBuffer) {
	t.Helper()
	cfg.Server.Role = r
	logs := &syncBuffer{}
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
		code, _ := get(t, "http://"+a.HTTPAddr()+"/readyz")
		return code == http.StatusOK
	})
	return a, logs
}

func outboxStatus(t *testing.T, pool *pgxpool.Pool, orderID string) string {
	t.Helper()
	var st string
	if err := pool.QueryRow(context.Background(),
		`SELECT status FROM outbox_events WHERE aggregate_id = $1 AND event_type = $2`, orderID, handoff.EventType).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// An api replica answers the API and runs no loop: the hand-off it commits
// stays PENDING. A worker replica on the same database serves no API (no gRPC
// listener, REST 404) and its relay hands the order off.
func TestRoles_APIServesAndRunsNoLoop_WorkerRunsLoopsAndServesNoAPI(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t, migrations.WorkOrder()...)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	provider := &blockingProvider{called: make(chan string, 4), release: make(chan struct{})}
	close(provider.release)
	cfg := testConfig(t, dsn, startProvider(t, provider))

	apiApp, apiLogs := startRole(t, cfg, server.RoleAPI)
	base := "http://" + apiApp.HTTPAddr()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/v1/work-orders",
		strings.NewReader(`{"customer_id":"acme","description":"paint","positions":2,"unit_price":{"currency_code":"EUR","minor_units":100}}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("create on the api replica: HTTP %d: %s", resp.StatusCode, body)
	}
	var id string
	if err := pool.QueryRow(context.Background(), `SELECT id::text FROM work_orders`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	// The server logged how many loops it started: none, by construction.
	if !strings.Contains(apiLogs.String(), `"role":"api"`) || !strings.Contains(apiLogs.String(), `"workers":0`) {
		t.Fatalf("api replica's serving line does not say role api with 0 workers:\n%s", apiLogs.String())
	}
	if st := outboxStatus(t, pool, id); st != "PENDING" || provider.calls.Load() != 0 {
		t.Fatalf("outbox %s, provider calls %d: the api replica dispatched", st, provider.calls.Load())
	}

	workerApp, _ := startRole(t, cfg, server.RoleWorker)
	if addr := workerApp.GRPCAddr(); addr != "" {
		t.Fatalf("worker replica bound gRPC at %s", addr)
	}
	wbase := "http://" + workerApp.HTTPAddr()
	if code, _ := get(t, wbase+"/v1/work-orders/"+id); code != http.StatusNotFound {
		t.Fatalf("worker replica GET /v1/work-orders/{id} = %d, want 404 (no REST API)", code)
	}
	if code, _ := get(t, wbase+"/healthz"); code != http.StatusOK {
		t.Fatalf("worker /healthz = %d", code)
	}
	waitfor.Value(t, 15*time.Second, "the worker replica hands the order off", "PUBLISHED", func() string { return outboxStatus(t, pool, id) })
	if got := <-provider.called; got != id {
		t.Fatalf("provider called for %s, want %s", got, id)
	}
	// The api replica still answers, and the hand-off shows through it.
	if code, body := get(t, base+"/v1/work-orders/"+id); code != http.StatusOK || !strings.Contains(body, "HANDED_OFF") {
		t.Fatalf("api replica GET = %d %s, want the order HANDED_OFF", code, body)
	}
}
