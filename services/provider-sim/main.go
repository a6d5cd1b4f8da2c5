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
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/app"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		// Before telemetry exists (bad config) the error still goes out as JSON.
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Error("provider-sim failed", "error", err.Error())
		os.Exit(1)
	}
}

func run(args []string) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd = args[0]
	}
	ctx, stop := server.SignalContext(context.Background())
	defer stop()
	env := envconfig.New()
	switch cmd {
	case "serve":
		var serveArgs []string
		if len(args) > 0 {
			serveArgs = args[1:]
		}
		return serve(ctx, env, serveArgs)
	case "migrate":
		return envconfig.Migrate(ctx, env, logger(), migrations.ProviderSim()...)
	case "provision":
		cfg := pubsub.ClientConfigFromEnv(env)
		if err := env.Err(); err != nil {
			return err
		}
		return pubsub.ProvisionCommand(ctx, cfg, topology.System(), logger())
	case "-h", "--help", "help":
		fmt.Println("usage: provider-sim [serve|migrate|provision]  (configuration from the environment: docs/failure-modes.md, services/provider-sim/README.md)")
		return nil
	default:
		return fmt.Errorf("unknown command %q (want serve, migrate or provision)", cmd)
	}
}

// logger is the JSON logger of the one-shot commands.
func logger() *slog.Logger {
	return telemetry.NewLogger(os.Stdout, slog.LevelInfo).With("service", app.ServiceName)
}

func serve(ctx context.Context, env *envconfig.Reader, args []string) (err error) {
	role, err := server.ParseServeFlags(args)
	if err != nil {
		return err
	}
	cfg, err := app.ConfigFromEnv(env)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if role != "" {
		cfg.Server.Role = role
	}
	tel, err := telemetry.Setup(ctx, cfg.Telemetry, os.Stdout)
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, tel.Shutdown(context.WithoutCancel(ctx)))
	}()
	a, err := app.New(ctx, cfg, tel.Logger, tel.Providers(),
		server.WithHTTPHandler("GET /metrics", tel.MetricsHandler))
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
