package app

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
)

// operatorService builds the one operator API (pkg/operator) over the
// work-order database (admin.OperatorDeps, as the CLI runs it), behind the
// operator token.
func (a *App) operatorService(pool *pgxpool.Pool, inv *invoicing.Invoicing) (*operator.Service, error) {
	deps, err := admin.OperatorDeps(pool, inv, a.cfg.Receiver, a.ps, a.log.With("component", "operator"))
	if err != nil {
		return nil, err
	}
	deps.Token = a.cfg.OperatorToken
	return operator.NewService(deps)
}

// GRPCServices is what the gRPC server mounts (empty in the worker role),
// for tests that check every mounted method.
func (a *App) GRPCServices() map[string]grpc.ServiceInfo {
	if a.srv.GRPC() == nil {
		return nil
	}
	return a.srv.GRPC().GetServiceInfo()
}
