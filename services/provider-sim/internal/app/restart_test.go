package app_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/app"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/faults"
)

// plan is what the fault generator decided for a job, as stored with it. The
// execution time carries the jitter draw.
type plan struct {
	RunForUS                                       int64
	EarlyCompletion, Duplicate, Unknown, CrashNext bool
	SplitFirst                                     int32
	Poison                                         string
}

// firstPlan starts the simulator against dsn with a fixed seed, submits one
// order, stops the simulator and returns the plan drawn for that order. It
// checks that GET /v1/faults names the stream in force: incarnation.
func firstPlan(t *testing.T, dsn string, emu *pubsubtest.Emulator, incarnation string) plan {
	t.Helper()
	cfg := app.Config{
		Auth:        libenv.CallerAuth{Disabled: true}, // caller authentication: tested apart
		DatabaseURL: dsn,
		Server:      server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminGRPCAddr: "127.0.0.1:0", AdminHTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second},
		PubSub:      pubsub.ClientConfig{ProjectID: emu.ProjectID, EmulatorHost: emu.Addr},
		// Executions outlast the test: only the draws matter here.
		Engine: engine.Config{Workers: 1, ExecBase: time.Hour, ExecJitter: 0.5},
		// Every knob but publish_then_crash (which would exit the test binary)
		// at a rate where two streams almost surely differ.
		Faults: faults.Rates{Duplicate: 0.5, SplitCompletion: 0.5, Poison: 0.5, UnknownOrder: 0.5, Seed: 7},
	}
	a, err := app.New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	conn, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var header http.Header
	waitfor.Condition(t, 5*time.Second, "GET /v1/faults answers", func() bool {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+a.AdminHTTPAddr()+"/v1/faults", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		header = resp.Header
		return resp.StatusCode == http.StatusOK
	})
	if got := header.Get("Grpc-Metadata-Provider-Incarnation"); got != incarnation {
		t.Errorf("GET /v1/faults: incarnation %q, want %q", got, incarnation)
	}
	id := uuid.NewString()
	if _, err := providerv1.NewProviderServiceClient(conn).SubmitWorkOrder(context.Background(), &providerv1.SubmitWorkOrderRequest{
		WorkOrderId: id, CustomerId: "c-1", Positions: 10,
	}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var p plan
	if err := pool.QueryRow(context.Background(), `SELECT run_for_us, fault_early_completion, fault_duplicate,
		fault_unknown_order, fault_crash_pending, fault_split_first, fault_poison FROM jobs WHERE work_order_id = $1`, id).Scan(
		&p.RunForUS, &p.EarlyCompletion, &p.Duplicate, &p.Unknown, &p.CrashNext, &p.SplitFirst, &p.Poison); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestARestartWithAFixedSeedDoesNotReplayTheFirstDraws(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	dsn := pgtest.NewDatabase(t, migrations.ProviderSim()...)
	first, second := firstPlan(t, dsn, emu, "1"), firstPlan(t, dsn, emu, "2")
	if first == second {
		t.Fatalf("the restart drew the same plan for its first job (%+v): the generator replayed its stream", first)
	}
	// Still reproducible as a whole: a fresh database replays start 1, then start 2.
	fresh := pgtest.NewDatabase(t, migrations.ProviderSim()...)
	if again := firstPlan(t, fresh, emu, "1"); again != first {
		t.Fatalf("first start on a fresh database drew %+v, want %+v (same seed, same start)", again, first)
	}
	if again := firstPlan(t, fresh, emu, "2"); again != second {
		t.Fatalf("second start on a fresh database drew %+v, want %+v (same seed, same start)", again, second)
	}
}

func TestInstanceIDIsReadAndABadOneIsNamed(t *testing.T) {
	t.Parallel()
	const dsn = "postgres://u@127.0.0.1:5432/providersim"
	cfg, err := app.ConfigFromEnv(envconfig.FromMap(map[string]string{"AUTH_DISABLED": "true", "DATABASE_URL": dsn, "INSTANCE_ID": "provider-sim-1"}))
	if err != nil || cfg.Engine.Instance != "provider-sim-1" {
		t.Fatalf("instance = %q (err %v), want provider-sim-1", cfg.Engine.Instance, err)
	}
	// '/' separates the instance from the incarnation in a lease owner.
	_, err = app.ConfigFromEnv(envconfig.FromMap(map[string]string{"AUTH_DISABLED": "true", "DATABASE_URL": dsn, "INSTANCE_ID": "provider/1"}))
	if err == nil || !strings.Contains(err.Error(), "INSTANCE_ID") {
		t.Fatalf("error %v does not name INSTANCE_ID", err)
	}
}
