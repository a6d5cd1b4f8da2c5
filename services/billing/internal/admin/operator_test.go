package admin_test

import (
	"context"
	"log/slog"
	"testing"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/services/billing/internal/admin"
)

// opsAuthz authorizes the OperatorService repairs of these tests.
var opsAuthz = &opsv1.OperatorAuthorization{Ticket: "INC-9", Actor: "carol"}

// operatorService serves the billing database's OperatorService
// (pkg/operator over admin.OperatorDeps) as the app mounts it: the outbox,
// operator_audit, r's invoice jobs and r's intake (consumer intake) with
// its parked messages and, with ps, its dead letters. It returns a client and a context carrying the operator token.
func (r repair) operatorService(t *testing.T, ps *gpubsub.Client) (opsv1.OperatorServiceClient, context.Context) {
	t.Helper()
	deps, err := admin.OperatorDeps(r.pool, r.queue, r.in, ps, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	deps.Token = token
	svc, err := operator.NewService(deps)
	if err != nil {
		t.Fatal(err)
	}
	conn := serveGRPC(t, svc.AuthInterceptor(), func(s *grpc.Server) { opsv1.RegisterOperatorServiceServer(s, svc) })
	return opsv1.NewOperatorServiceClient(conn), metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
}
