package app_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/testkit/roletest"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/app"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
)

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
// listener, REST 404) and its relay hands the order off (internal/testkit/roletest).
func TestRoles_APIServesAndRunsNoLoop_WorkerRunsLoopsAndServesNoAPI(t *testing.T) {
	t.Parallel()
	// As the runtime role, as deployed: the grants must suffice.
	_, dsn := pgtest.RuntimeRole(t, pgtest.NewDatabase(t, migrations.WorkOrder()...), migrations.WorkOrder()...)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	provider := &blockingProvider{called: make(chan string, 4), release: make(chan struct{})}
	close(provider.release)
	cfg := testConfig(t, dsn, startProvider(t, provider))

	var id string
	roletest.Run(t, roletest.Replicas[*app.App]{
		New: func(r server.Role, logger *slog.Logger) (*app.App, error) {
			cfg := cfg
			cfg.Server.Role = r
			return app.New(context.Background(), cfg, logger, telemetry.Providers{})
		},
		APIOnly: func(t *testing.T, apiApp *app.App) {
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
			if err := pool.QueryRow(context.Background(), `SELECT id::text FROM work_orders`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if st := outboxStatus(t, pool, id); st != "PENDING" || provider.calls.Load() != 0 {
				t.Fatalf("outbox %s, provider calls %d: the api replica dispatched", st, provider.calls.Load())
			}
		},
		NotServedByWorker: func() roletest.Request {
			return roletest.Request{Method: http.MethodGet, Path: "/v1/work-orders/" + id}
		},
		WithWorker: func(t *testing.T, apiApp, _ *app.App) {
			waitfor.Value(t, 15*time.Second, "the worker replica hands the order off", "PUBLISHED", func() string { return outboxStatus(t, pool, id) })
			if got := <-provider.called; got != id {
				t.Fatalf("provider called for %s, want %s", got, id)
			}
			// The api replica still answers, and the hand-off shows through it.
			if code, body := get(t, "http://"+apiApp.HTTPAddr()+"/v1/work-orders/"+id); code != http.StatusOK || !strings.Contains(body, "HANDED_OFF") {
				t.Fatalf("api replica GET = %d %s, want the order HANDED_OFF", code, body)
			}
		},
	})
}
