// Command console is the operations console of lossless: server-rendered
// pages (Overview, Orders, an order's page, Faults, Repair) that read and
// act only through the other services' gRPC APIs and read their Prometheus
// /metrics. It has no database and publishes nothing.
//
// Usage:
//
//	console [serve]   serve HTTP on HTTP_ADDR (default :8089); configuration
//	                  from the environment (services/console/internal/config)
package main

import (
	"os"

	"github.com/lossless-dev/lossless/internal/servicecmd"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/console/internal/app"
	"github.com/lossless-dev/lossless/services/console/internal/config"
)

func main() { os.Exit(servicecmd.Main(service())) }

// service is the console's command line (internal/servicecmd): serve alone,
// without roles, migrations or Pub/Sub. The console reads only its own
// variables (ADR 0016): its telemetry is its log level.
func service() servicecmd.Service[config.Config, *app.App] {
	return servicecmd.Service[config.Config, *app.App]{
		Name:   config.ServiceName,
		Usage:  "usage: console [serve]  (configuration from the environment: services/console/internal/config)",
		Config: config.FromEnv,
		Sections: func(c *config.Config) (*server.Config, telemetry.Config) {
			return nil, telemetry.Config{ServiceName: config.ServiceName, LogLevel: c.LogLevel.String()}
		},
		New: app.New,
	}
}
