package app_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/testkit/roletest"
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

// roleConfig is a billing process on dsn and emu, with fast polls.
func roleConfig(dsn string, emu *pubsubtest.Emulator) config.Config {
	cfg := config.Config{
		Common: serviceapp.Common{
			Auth:      libenv.CallerAuth{Disabled: true}, // caller authentication: tested apart
			Database:  pgdb.Config{URL: dsn},
			Server:    server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminGRPCAddr: "127.0.0.1:0", AdminHTTPAddr: "127.0.0.1:0", ShutdownTimeout: 10 * time.Second},
			PubSub:    pubsub.ClientConfig{ProjectID: emu.ProjectID, EmulatorHost: emu.Addr},
			Telemetry: telemetry.Config{ServiceName: config.ServiceName},
		},
		Outbox: outbox.Config{PollInterval: 20 * time.Millisecond},
		Queue:  leasequeue.Config{Name: config.QueueName, LeaseDuration: lease},
		Worker: leasequeue.WorkerConfig{
			Workers: 2, PollInterval: 20 * time.Millisecond, RescueInterval: 20 * time.Millisecond,
			HeartbeatInterval: lease / 3, ShutdownGrace: time.Second,
		},
		JobMaxAttempts: 5,
	}
	cfg.Subscriber = pubsub.DefaultSubscriberConfigFor(cfg.PubSub)
	return cfg
}

// An api replica serves the invoices API and runs no loop: a completion
// event waits undelivered on its subscription and no invoice is issued. A
// worker replica on the same database and subscription serves no API (no
// gRPC listener, REST 404), consumes the event and issues the invoice, which
// the api replica then serves (internal/testkit/roletest).
func TestRoles_APIServesAndRunsNoLoop_WorkerRunsLoopsAndServesNoAPI(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	cfg := roleConfig(pool.Config().ConnString(), emu)

	ctx := context.Background()
	orderID := uuid.New()
	list := "/v1/invoices?work_order_id=" + orderID.String()
	roletest.Run(t, roletest.Replicas[*app.App]{
		New: func(r server.Role, logger *slog.Logger) (*app.App, error) {
			cfg := cfg
			cfg.Server.Role = r
			return app.New(context.Background(), cfg, logger, telemetry.Providers{})
		},
		APIOnly: func(t *testing.T, apiApp *app.App) {
			in, err := pubsub.NewPublisher(emu.Client, topology.TopicWorkOrderEvents, pubsub.DefaultPublisherConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer in.Stop()
			ev := completion(orderID)
			if _, err := in.Publish(ctx, pubsub.Message{EventID: ev.GetEventId(), OrderingKey: orderID.String(), Event: ev}); err != nil {
				t.Fatal(err)
			}
			code, body := roletest.Do(t, http.MethodGet, "http://"+apiApp.HTTPAddr()+list, "")
			if code != http.StatusOK || strings.Contains(body, orderID.String()) {
				t.Fatalf("api replica GET /v1/invoices = %d %s, want served and empty", code, body)
			}
			msgs := emu.Server.Messages()
			if len(msgs) != 1 || msgs[0].Deliveries != 0 {
				t.Fatalf("completion event: %d messages, deliveries %v; want one, never pulled by the api replica", len(msgs), msgs)
			}
			if n := countRows(t, pool, `SELECT count(*) FROM leasequeue_jobs`); n != 0 {
				t.Fatalf("%d invoice jobs with only the api replica running; want none", n)
			}
		},
		NotServedByWorker: func() roletest.Request { return roletest.Request{Method: http.MethodGet, Path: list} },
		WithWorker: func(t *testing.T, apiApp, _ *app.App) {
			waitfor.Value(t, 15*time.Second, "the worker replica issues the invoice", 1, func() int {
				return countRows(t, pool, `SELECT count(*) FROM invoices WHERE work_order_id = $1`, orderID)
			})
			if code, body := roletest.Do(t, http.MethodGet, "http://"+apiApp.HTTPAddr()+list, ""); code != http.StatusOK || !strings.Contains(body, orderID.String()) || !strings.Contains(body, `"number"`) {
				t.Fatalf("api replica GET /v1/invoices = %d %s, want the issued invoice", code, body)
			}
		},
	})
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
