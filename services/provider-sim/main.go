// Command provider-sim is the external provider of the lossless story: it
// accepts work orders over gRPC (ProviderService), executes them, and
// announces progress on the Pub/Sub topic work-order-completed, with fault
// knobs that reproduce failure modes on demand (docs/failure-modes.md).
//
// Usage:
//
//	provider-sim [serve [--role api|worker|all]]
//	                       serve gRPC :9091 and REST :8081 and run the engine (default;
//	                       role also from SERVICE_ROLE, see docs/adr/0013-api-and-worker-roles.md)
//	provider-sim migrate   apply the database migrations and exit
//	provider-sim provision create the Pub/Sub topics and subscriptions and exit
package main

import (
	"os"

	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/internal/servicecmd"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/app"
)

func main() { os.Exit(servicecmd.Main(service())) }

// service is the simulator's command line (internal/servicecmd).
func service() servicecmd.Service[app.Config, *app.App] {
	return serviceapp.CommandLine(servicecmd.Service[app.Config, *app.App]{
		Name:        app.ServiceName,
		Usage:       "usage: provider-sim [serve|migrate|provision]  (configuration from the environment: docs/failure-modes.md, services/provider-sim/README.md)",
		Config:      app.ConfigFromEnv,
		Sections:    func(c *app.Config) (*server.Config, telemetry.Config) { return &c.Server, c.Telemetry },
		New:         app.New,
		Declaration: declaration, // its own service.json only (service.go)
	}, serviceapp.Commands[app.Config]{
		PubSub:     func(c *app.Config) *pubsub.ClientConfig { return &c.PubSub },
		Migrations: migrations.ProviderSim(),
	})
}
