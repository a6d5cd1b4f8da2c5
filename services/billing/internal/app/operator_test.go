package app_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/testkit/roletest"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/billing/internal/app"
)

// Billing mounts OperatorService (pkg/operator) over its own database behind
// its operator token (roletest.OperatorServiceIsMounted says what that owes).
func TestOperatorServiceIsMountedBehindTheToken(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	const token = "s3cret-billing-operator-token-32c"
	a, _ := roletest.Start(t, func(r server.Role, logger *slog.Logger) (*app.App, error) {
		cfg := roleConfig(pool.Config().ConnString(), emu)
		cfg.OperatorToken = token
		cfg.Server.Role = r
		return app.New(context.Background(), cfg, logger, telemetry.Providers{})
	}, server.RoleAll)
	roletest.OperatorServiceIsMounted(t, a.AdminGRPCAddr(), token)
	// Every service on the admin listener is an admin service: each of its
	// methods, as the descriptors list them, refuses a call without the token.
	roletest.AdminRPCsRefuseWithoutToken(t, roletest.Guarded{Addr: a.AdminGRPCAddr(), Mounted: a.AdminGRPCServices()})
	// The public listener serves none of them.
	roletest.AdminServicesNotOnThePublicListener(t, a.GRPCAddr(), a.GRPCServices(), a.AdminGRPCServices())
}
