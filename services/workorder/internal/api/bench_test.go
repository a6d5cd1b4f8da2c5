package api_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/google/uuid"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/workorder/internal/api"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// BenchmarkCreateWorkOrder measures the create write path (order, transition,
// outbox event in one transaction) called in-process, without and with an
// idempotency key, to show what the key costs. Compare the two ns/op in the
// same run; absolute figures follow the machine's commit latency.
func BenchmarkCreateWorkOrder(b *testing.B) {
	// Called in-process: the principal pkg/server's authentication and
	// pkg/authz would have admitted.
	benchCaller := authz.ContextWithPrincipal(context.Background(),
		authz.Principal{Caller: server.Caller{Subject: "bench"}, Kind: authz.KindClient, Customers: authz.All()})
	pool := pgtest.NewPool(b, migrations.WorkOrder()...)
	logger := slog.New(slog.DiscardHandler)
	repo, err := orders.NewRepository(pool)
	if err != nil {
		b.Fatal(err)
	}
	keys, err := idempotency.NewStore(pool, idempotency.Config{}, logger, nil)
	if err != nil {
		b.Fatal(err)
	}
	svc, err := api.NewService(pool, repo, keys, nil, logger, nil)
	if err != nil {
		b.Fatal(err)
	}
	var wo workorderv1.WorkOrder
	if err := protojson.Unmarshal([]byte(validOrder), &wo); err != nil {
		b.Fatal(err)
	}
	req := &workorderv1.CreateWorkOrderRequest{WorkOrder: &wo}

	b.Run("without-key", func(b *testing.B) {
		for b.Loop() {
			if _, err := svc.CreateWorkOrder(benchCaller, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("with-key", func(b *testing.B) {
		for b.Loop() {
			ctx := metadata.NewIncomingContext(benchCaller, metadata.Pairs(idempotency.MetadataKey, uuid.NewString()))
			if _, err := svc.CreateWorkOrder(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		ctx := metadata.NewIncomingContext(benchCaller, metadata.Pairs(idempotency.MetadataKey, uuid.NewString()))
		for b.Loop() {
			if _, err := svc.CreateWorkOrder(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
