package app_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/lossless-dev/lossless/internal/testkit/roletest"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/workorder/internal/app"
)

// Workorder mounts OperatorService (pkg/operator) over its own database
// behind its operator token (roletest.OperatorServiceIsMounted says what
// that owes).
func TestOperatorServiceIsMountedBehindTheToken(t *testing.T) {
	t.Parallel()
	// As the runtime role, as deployed: the grants must suffice.
	_, dsn := pgtest.RuntimeRole(t, pgtest.NewDatabase(t, migrations.WorkOrder()...), migrations.WorkOrder()...)
	provider := startProvider(t, &blockingProvider{called: make(chan string, 1), release: make(chan struct{})})
	a, _ := roletest.Start(t, func(r server.Role, logger *slog.Logger) (*app.App, error) {
		cfg := testConfig(t, dsn, provider)
		cfg.OperatorToken = operatorToken
		cfg.Server.Role = r
		return app.New(context.Background(), cfg, logger, telemetry.Providers{})
	}, server.RoleAll)
	roletest.OperatorServiceIsMounted(t, a.AdminGRPCAddr(), operatorToken)
	// Every service on the admin listener is an admin service: each of its
	// methods, as the descriptors list them, refuses a call without the token.
	roletest.AdminRPCsRefuseWithoutToken(t, roletest.Guarded{Addr: a.AdminGRPCAddr(), Mounted: a.AdminGRPCServices()})
	// The public listener serves none of them.
	roletest.AdminServicesNotOnThePublicListener(t, a.GRPCAddr(), a.GRPCServices(), a.AdminGRPCServices())
}
