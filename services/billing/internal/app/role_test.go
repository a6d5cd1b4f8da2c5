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

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/billing/internal/app"
	"github.com/lossless-dev/lossless/services/billing/internal/config"
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

// roleConfig is a billing process on dsn and emu, with fast polls.
func roleConfig(dsn string, emu *pubsubtest.Emulator) config.Config {
	cfg := config.Config{
		Database: pgdb.Config{URL: dsn},
		Server:   server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 10 * time.Second},
		PubSub:   pubsub.ClientConfig{ProjectID: emu.ProjectID, EmulatorHost: emu.Addr},
		Outbox:   outbox.Config{PollInterval: 20 * time.Millisecond},
		Queue:    leasequeue.Config{Name: config.QueueName, LeaseDuration: lease},
		Worker: leasequeue.WorkerConfig{
			Workers: 2, PollInterval: 20 * time.Millisecond, RescueInterval: 20 * time.Millisecond,
			HeartbeatInterval: lease / 3, ShutdownGrace: time.Second,
		},
		JobMaxAttempts: 5,
		Telemetry:      telemetry.Config{ServiceName: config.ServiceName},
	}
	cfg.Subscriber = pubsub.DefaultSubscriberConfigFor(cfg.PubSub)
	return cfg
}

// startBillingRole runs billing in role r until the test ends and waits
// until it is ready; the returned logs are its own.
func startBillingRole(t *testing.T, cfg config.Config, r server.Role) (*app.App, *roleLogs) {
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
		code, _ := httpGet(t, "http://"+a.HTTPAddr()+"/readyz")
		return code == http.StatusOK
	})
	return a, logs
}

func httpGet(t *testing.T, url string) (int, string) {
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

// An api replica serves the invoices API and runs no loop: a completion
// event waits undelivered on its subscription and no invoice is issued. A
// worker replica on the same database and subscription serves no API (no
// gRPC listener, REST 404), consumes the event and issues the invoice, which
// the api replica then serves.
func TestRoles_APIServesAndRunsNoLoop_WorkerRunsLoopsAndServesNoAPI(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	emu := pubsubtest.New(t, topology.System())
	cfg := roleConfig(pool.Config().ConnString(), emu)

	apiApp, apiLogs := startBillingRole(t, cfg, server.RoleAPI)
	ctx := context.Background()
	orderID := uuid.New()
	in, err := pubsub.NewPublisher(emu.Client, topology.TopicWorkOrderEvents, pubsub.DefaultPublisherConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop()
	ev := completion(orderID)
	if _, err := in.Publish(ctx, pubsub.Message{EventID: ev.GetEventId(), OrderingKey: orderID.String(), Event: ev}); err != nil {
		t.Fatal(err)
	}

	list := "http://" + apiApp.HTTPAddr() + "/v1/invoices?work_order_id=" + orderID.String()
	code, body := httpGet(t, list)
	if code != http.StatusOK || strings.Contains(body, orderID.String()) {
		t.Fatalf("api replica GET /v1/invoices = %d %s, want served and empty", code, body)
	}
	// The server logged how many loops it started: none, by construction.
	if !strings.Contains(apiLogs.String(), `"role":"api"`) || !strings.Contains(apiLogs.String(), `"workers":0`) {
		t.Fatalf("api replica's serving line does not say role api with 0 workers:\n%s", apiLogs.String())
	}
	msgs := emu.Server.Messages()
	if len(msgs) != 1 || msgs[0].Deliveries != 0 {
		t.Fatalf("completion event: %d messages, deliveries %v; want one, never pulled by the api replica", len(msgs), msgs)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM leasequeue_jobs`); n != 0 {
		t.Fatalf("%d invoice jobs with only the api replica running; want none", n)
	}

	workerApp, _ := startBillingRole(t, cfg, server.RoleWorker)
	if addr := workerApp.GRPCAddr(); addr != "" {
		t.Fatalf("worker replica bound gRPC at %s", addr)
	}
	wbase := "http://" + workerApp.HTTPAddr()
	if code, _ := httpGet(t, wbase+"/v1/invoices?work_order_id="+orderID.String()); code != http.StatusNotFound {
		t.Fatalf("worker replica GET /v1/invoices = %d, want 404 (no REST API)", code)
	}
	if code, _ := httpGet(t, wbase+"/healthz"); code != http.StatusOK {
		t.Fatalf("worker /healthz = %d", code)
	}
	waitfor.Value(t, 15*time.Second, "the worker replica issues the invoice", 1, func() int {
		return countRows(t, pool, `SELECT count(*) FROM invoices WHERE work_order_id = $1`, orderID)
	})
	if code, body := httpGet(t, list); code != http.StatusOK || !strings.Contains(body, orderID.String()) || !strings.Contains(body, `"number"`) {
		t.Fatalf("api replica GET /v1/invoices = %d %s, want the issued invoice", code, body)
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
