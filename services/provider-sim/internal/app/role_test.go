package app_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/testkit/roletest"
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

// An api replica accepts the hand-off and runs no engine: the job stays
// ACCEPTED and no completion is published. A worker replica on the same
// database serves no API (no gRPC listener, REST 404) and its engine runs the
// job to DONE, publishing the completion (internal/testkit/roletest).
func TestRoles_APIAcceptsAndRunsNoEngine_WorkerRunsTheEngineAndServesNoAPI(t *testing.T) {
	t.Parallel()
	// As the runtime role, as deployed: the grants must suffice.
	_, dsn := pgtest.RuntimeRole(t, pgtest.NewDatabase(t, migrations.ProviderSim()...), migrations.ProviderSim()...)
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg := app.Config{
		Auth:        libenv.CallerAuth{Disabled: true}, // caller authentication: tested apart
		DatabaseURL: dsn,
		Server:      server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminGRPCAddr: "127.0.0.1:0", AdminHTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second},
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

	id := uuid.NewString()
	roletest.Run(t, roletest.Replicas[*app.App]{
		New: func(r server.Role, logger *slog.Logger) (*app.App, error) {
			cfg := cfg
			cfg.Server.Role = r
			return app.New(context.Background(), cfg, logger, telemetry.Providers{})
		},
		APIOnly: func(t *testing.T, apiApp *app.App) {
			conn, err := grpc.NewClient(apiApp.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			if _, err := providerv1.NewProviderServiceClient(conn).SubmitWorkOrder(context.Background(), &providerv1.SubmitWorkOrderRequest{
				WorkOrderId: id, CustomerId: "c-1", Positions: 1,
			}); err != nil {
				t.Fatalf("hand-off to the api replica: %v", err)
			}
			if st := jobStatus(id); st != "ACCEPTED" {
				t.Fatalf("job %s with only the api replica running; want ACCEPTED", st)
			}
			if msgs := emu.Server.Messages(); len(msgs) != 0 {
				t.Fatalf("%d completions published with only the api replica running; want none", len(msgs))
			}
		},
		NotServedByWorker: func() roletest.Request {
			return roletest.Request{Method: http.MethodPost, Path: "/v1/jobs",
				Body: `{"workOrderId":"` + uuid.NewString() + `","customerId":"c-1","positions":1}`}
		},
		WithWorker: func(t *testing.T, _, _ *app.App) {
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
		},
	})
}

func countJobs(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
