package api_test

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
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
	emu := pubsubtest.New(t, topology.System())
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
	p, err := api.NewProvider(eng, logger)
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
