package admin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/services/billing/internal/admin"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

// opsAuthz authorizes the OperatorService repairs of these tests.
var opsAuthz = &opsv1.OperatorAuthorization{Ticket: "INC-9", Actor: "carol"}

// operatorService serves the billing database's OperatorService
// (pkg/operator) as the app mounts it: the outbox, operator_audit and r's
// intake (consumer intake) with its parked messages and, with ps, its dead
// letters. It returns a client and a context carrying the operator token.
func (r repair) operatorService(t *testing.T, ps *gpubsub.Client) (opsv1.OperatorServiceClient, context.Context) {
	t.Helper()
	store, err := parked.New()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := operator.NewService(operator.Deps{DB: r.pool, Token: token, TokenEnv: admin.EnvOperatorToken,
		Parked: store, PubSub: ps, Logger: slog.New(slog.DiscardHandler), Consumers: []operator.Consumer{{
			Name: "intake", DeadLetterSubscription: topology.SubWorkOrderEventsDeadLetter, Process: r.in.Process,
			Replay: func(ctx context.Context, tx pgx.Tx, id int64, ticket, actor string) (string, error) {
				outcome, err := r.in.Replay(ctx, tx, id, ticket, actor)
				if errors.Is(err, intake.ErrStillRefused) {
					return "", fmt.Errorf("%w: %w", operator.ErrStillRefused, err)
				}
				return outcome, err
			},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	conn := serveGRPC(t, svc.AuthInterceptor(), func(s *grpc.Server) { opsv1.RegisterOperatorServiceServer(s, svc) })
	return opsv1.NewOperatorServiceClient(conn), metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
}
