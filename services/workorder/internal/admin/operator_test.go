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

	"github.com/lossless-dev/lossless/internal/topology"
	pkgoperator "github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
)

// opsAuth authorizes the OperatorService repairs of these tests.
var opsAuth = &opsv1.OperatorAuthorization{Ticket: "INC-12", Actor: "dana"}

// servedOps serves the work-order database's OperatorService
// (pkg/operator) as the app mounts it: the outbox, operator_audit and the
// InvoiceIssued consumer (invoicing, b's) with its parked messages and, with
// ps, its dead letters. It returns a client.
func servedOps(t *testing.T, b bundle, ps *gpubsub.Client) opsv1.OperatorServiceClient {
	t.Helper()
	store, err := parked.New()
	if err != nil {
		t.Fatal(err)
	}
	inv := b.ops.Invoicing()
	svc, err := pkgoperator.NewService(pkgoperator.Deps{DB: b.pool, Token: token, TokenEnv: admin.EnvOperatorToken,
		Parked: store, PubSub: ps, Logger: slog.New(slog.DiscardHandler), Consumers: []pkgoperator.Consumer{{
			Name: "invoicing", DeadLetterSubscription: topology.SubBillingEventsDeadLetter, Process: inv.Process,
			Replay: func(ctx context.Context, tx pgx.Tx, id int64, ticket, actor string) (string, error) {
				outcome, err := inv.Replay(ctx, tx, id, ticket, actor)
				if errors.Is(err, invoicing.ErrStillRefused) {
					return "", fmt.Errorf("%w: %w", pkgoperator.ErrStillRefused, err)
				}
				return outcome, err
			},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	conn := serveGRPC(t, svc.AuthInterceptor(), func(s *grpc.Server) { opsv1.RegisterOperatorServiceServer(s, svc) })
	return opsv1.NewOperatorServiceClient(conn)
}
