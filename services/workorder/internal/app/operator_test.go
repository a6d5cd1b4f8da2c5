package app_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	opsv1 "github.com/lossless-dev/lossless/gen/lossless/ops/v1"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/app"
)

// The service mounts OperatorService (pkg/operator) over its own database
// behind its operator token: refused without the token, with it a requeue
// dry run is answered and lands in the service's operator_audit, which the
// same API lists.
func TestOperatorServiceIsMountedBehindTheToken(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t, migrations.WorkOrder()...)
	cfg := testConfig(t, dsn, startProvider(t, &blockingProvider{called: make(chan string, 1), release: make(chan struct{})}))
	cfg.OperatorToken = operatorToken
	a, err := app.New(context.Background(), cfg, slog.New(slog.DiscardHandler), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	conn, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ops := opsv1.NewOperatorServiceClient(conn)
	waitfor.Condition(t, 10*time.Second, "server up", func() bool {
		_, err := ops.ListOperatorAudit(context.Background(), &opsv1.ListOperatorAuditRequest{})
		return status.Code(err) != codes.Unavailable
	})
	if _, err := ops.ListOutboxEvents(context.Background(), &opsv1.ListOutboxEventsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want UNAUTHENTICATED", err)
	}
	authed := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+operatorToken))
	id := uuid.NewString()
	dry, err := ops.RequeueOutboxEvents(authed, &opsv1.RequeueOutboxEventsRequest{EventIds: []string{id}, DryRun: true,
		Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-30", Actor: "gina"}})
	if err != nil || len(dry.GetSkipped()) != 1 || dry.GetSkipped()[0].GetState() != "" {
		t.Fatalf("requeue dry run of an unknown event: %v %v", dry, err)
	}
	audit, err := ops.ListOperatorAudit(authed, &opsv1.ListOperatorAuditRequest{Ticket: "INC-30"})
	if err != nil || len(audit.GetRecords()) != 1 || audit.GetRecords()[0].GetAction() != "outbox.requeue" || !audit.GetRecords()[0].GetDryRun() {
		t.Fatalf("audit of the dry run: %v %v", audit, err)
	}
}
