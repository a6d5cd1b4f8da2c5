package api_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/api"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/faults"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// An order whose values the store rejects (a NUL byte reaching PostgreSQL,
// as from a caller without the validating interceptor) is INVALID_ARGUMENT:
// the caller's outbox parks it. UNAVAILABLE would make it retry the same
// rejected values forever.
func TestSubmitRejectedByTheStoreIsInvalidArgumentNotUnavailable(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, migrations.ProviderSim()...)
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicWorkOrderCompleted, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	dice, err := faults.NewDice(faults.Rates{Seed: 1}, faults.Stream{})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	eng, err := engine.New(pool, pub, dice, engine.Config{}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := api.NewProvider(eng, dice, logger)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.SubmitWorkOrder(context.Background(), &providerv1.SubmitWorkOrderRequest{
		WorkOrderId: uuid.NewString(), CustomerId: "c-1", Description: "paint\x00the fence", Positions: 1,
	})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%v, want INVALID_ARGUMENT", err)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("jobs = %d, want 0", n)
	}
}

// served starts a gRPC server with the provider on a loopback port and
// returns a client of it, the provider's store and its fault dice.
func served(t *testing.T, rates faults.Rates, opts ...api.Option) (providerv1.ProviderServiceClient, *pgxpool.Pool, *faults.Dice) {
	t.Helper()
	pool := pgtest.NewPool(t, migrations.ProviderSim()...)
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicWorkOrderCompleted, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	dice, err := faults.NewDice(rates, faults.Stream{})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	eng, err := engine.New(pool, pub, dice, engine.Config{}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := api.NewProvider(eng, dice, logger, opts...)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	providerv1.RegisterProviderServiceServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return providerv1.NewProviderServiceClient(conn), pool, dice
}

func submitRequest(id uuid.UUID) *providerv1.SubmitWorkOrderRequest {
	return &providerv1.SubmitWorkOrderRequest{WorkOrderId: id.String(), CustomerId: "c-1", Description: "paint the fence", Positions: 2}
}

// Every SubmitWorkOrder answer, a repeat's too, waits the delay drawn from
// accept_latency_*: the injected sleep sees the drawn delay, and the call
// answers after it.
func TestSubmitAnswersAfterTheDrawnAcceptLatency(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		slept []time.Duration
	)
	record := func(_ context.Context, d time.Duration) error {
		mu.Lock()
		defer mu.Unlock()
		slept = append(slept, d)
		return nil
	}
	const delay = 300 * time.Millisecond
	client, _, _ := served(t, faults.Rates{AcceptLatencyP50: delay, AcceptLatencyP99: delay, Seed: 1}, api.WithSleep(record))
	id := uuid.New()
	first, err := client.SubmitWorkOrder(context.Background(), submitRequest(id))
	if err != nil || !first.GetCreated() {
		t.Fatalf("submit: %v (created %v)", err, first.GetCreated())
	}
	again, err := client.SubmitWorkOrder(context.Background(), submitRequest(id))
	if err != nil || again.GetCreated() || again.GetAcceptance().GetJobId() != first.GetAcceptance().GetJobId() {
		t.Fatalf("repeat: %v, %v", err, again)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(slept) != 2 || slept[0] != delay || slept[1] != delay {
		t.Fatalf("slept %v, want [%v %v]", slept, delay, delay)
	}
}

// Without an injected sleep the delay is really waited: the call takes at
// least the drawn delay (a lower bound only; a loaded machine may add any
// amount).
func TestSubmitReallyWaitsTheAcceptLatency(t *testing.T) {
	t.Parallel()
	const delay = 200 * time.Millisecond
	client, _, _ := served(t, faults.Rates{AcceptLatencyP50: delay, AcceptLatencyP99: delay, Seed: 1})
	start := time.Now()
	if _, err := client.SubmitWorkOrder(context.Background(), submitRequest(uuid.New())); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < delay {
		t.Fatalf("answered after %v, before the %v delay", took, delay)
	}
}

// With accept_timeout 1 a call never answers: the caller's deadline expires
// (DEADLINE_EXCEEDED), yet the provider has recorded the job, exactly once,
// and the retry once the knob is off returns that job as a repeat.
func TestSubmitTimeoutRecordsTheJobAndTheRetryFindsIt(t *testing.T) {
	t.Parallel()
	client, pool, dice := served(t, faults.Rates{AcceptTimeout: 1, Seed: 1})
	id := uuid.New()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := client.SubmitWorkOrder(ctx, submitRequest(id))
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("%v, want DEADLINE_EXCEEDED", err)
	}
	var jobID string
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*), min(job_id::text) FROM jobs WHERE work_order_id = $1`, id).Scan(&n, &jobID); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("jobs of the timed-out order = %d, want 1", n)
	}
	if err := dice.Set(faults.Rates{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	resp, err := client.SubmitWorkOrder(context.Background(), submitRequest(id))
	if err != nil || resp.GetCreated() || resp.GetAcceptance().GetJobId() != jobID {
		t.Fatalf("retry: %v, %v; want the job %s as a repeat", err, resp, jobID)
	}
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE work_order_id = $1`, id).Scan(&n); err != nil || n != 1 {
		t.Fatalf("jobs after the retry = %d (%v), want 1", n, err)
	}
}

// Called without the validating interceptor (as on a server that lacks
// it), UpdateFaults still refuses a change without an authorization, or
// with a bad knob, naming every field, and changes nothing: no knob, no
// operator_audit row.
func TestUpdateFaultsChecksItsRequestWithoutTheInterceptor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, migrations.ProviderSim()...)
	dice, err := faults.NewDice(faults.Rates{Seed: 1}, faults.Stream{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := api.NewAdmin(pool, dice, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.UpdateFaults(ctx, &providerv1.UpdateFaultsRequest{Faults: &providerv1.Faults{Duplicate: 2}})
	var fields []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	if status.Code(err) != codes.InvalidArgument || strings.Join(fields, ",") != "faults.duplicate,authorization" {
		t.Fatalf("%v (fields %v), want INVALID_ARGUMENT naming faults.duplicate and authorization", err, fields)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM operator_audit`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if r := dice.Rates(); r.Duplicate != 0 || r.Seed != 1 || rows != 0 {
		t.Fatalf("after a refused change: knobs %+v, %d audit rows", r, rows)
	}
}
