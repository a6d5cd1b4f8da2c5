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
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/billing/internal/app"
)

// The service mounts OperatorService (pkg/operator) over its own database
// behind its operator token: refused without the token, with it a requeue
// dry run is answered and lands in the service's operator_audit, which the
// same API lists.
func TestOperatorServiceIsMountedBehindTheToken(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	emu := pubsubtest.New(t, topology.System())
	cfg := roleConfig(pool.Config().ConnString(), emu)
	const token = "s3cret-billing-operator-token-32c"
	cfg.OperatorToken = token
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
	if _, err := ops.ListParkedMessages(context.Background(), &opsv1.ListParkedMessagesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want UNAUTHENTICATED", err)
	}
	authed := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
	dry, err := ops.RequeueOutboxEvents(authed, &opsv1.RequeueOutboxEventsRequest{EventIds: []string{uuid.NewString()}, DryRun: true,
		Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-31", Actor: "hal"}})
	if err != nil || len(dry.GetSkipped()) != 1 || dry.GetSkipped()[0].GetState() != "" {
		t.Fatalf("requeue dry run of an unknown event: %v %v", dry, err)
	}
	audit, err := ops.ListOperatorAudit(authed, &opsv1.ListOperatorAuditRequest{Ticket: "INC-31"})
	if err != nil || len(audit.GetRecords()) != 1 || audit.GetRecords()[0].GetAction() != "outbox.requeue" || !audit.GetRecords()[0].GetDryRun() {
		t.Fatalf("audit of the dry run: %v %v", audit, err)
	}
}
