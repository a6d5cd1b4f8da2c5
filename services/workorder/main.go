// Command workorder is the work-order service: it takes work orders over
// gRPC and REST, hands them to the provider through a transactional outbox,
// and (with the inbox) follows them to completion.
//
// Usage:
//
//	workorder [serve [--role api|worker|all]]
//	                    serve gRPC :9090 and REST :8080 and run the background loops (default;
//	                    role also from SERVICE_ROLE, see docs/adr/0013-api-and-worker-roles.md)
//	workorder migrate   apply the database migrations and exit
//	workorder provision create the Pub/Sub topics and subscriptions (idempotent) and exit
//	workorder inbox ... operator commands on the inbox (list, show, replay,
//	                    replay-dead-letters, cleanup, re-hand-off); see
//	                    docs/runbooks/repair-parked-inbox-entries.md
//	workorder outbox|parked|dead-letters|audit ...
//	                    the operator commands every service has (pkg/operator RunCLI: outbox
//	                    list|requeue, parked list|replay, dead-letters replay, audit list) over
//	                    the outbox and the InvoiceIssued consumer; see
//	                    docs/runbooks/outbox-relay-stalled.md, docs/runbooks/replay-dead-letter-events.md
//	workorder invoicing replay|replay-dead-letters
//	                    former names of parked replay and dead-letters replay
//
// Configuration comes from the environment; see internal/config.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/servicecmd"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
	"github.com/lossless-dev/lossless/services/workorder/internal/app"
	"github.com/lossless-dev/lossless/services/workorder/internal/config"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

func main() { os.Exit(servicecmd.Main(service())) }

// service is the work-order service's command line (internal/servicecmd).
func service() servicecmd.Service[config.Config, *app.App] {
	return servicecmd.Service[config.Config, *app.App]{
		Name:       config.ServiceName,
		Usage:      "usage: workorder [serve|migrate|provision|inbox|outbox|parked|dead-letters|audit|invoicing]  (configuration from the environment: services/workorder/internal/config)",
		Config:     config.FromEnv,
		Sections:   func(c *config.Config) (*server.Config, telemetry.Config) { return &c.Server, c.Telemetry },
		PubSub:     func(c *config.Config) *pubsub.ClientConfig { return &c.PubSub },
		New:        app.New,
		Migrations: migrations.WorkOrder(),
		Commands: map[string]servicecmd.Command{
			"inbox":        inboxCommand,
			"invoicing":    invoicingCommand,
			"outbox":       operatorCommand("outbox"),
			"parked":       operatorCommand("parked"),
			"dead-letters": operatorCommand("dead-letters"),
			"audit":        operatorCommand("audit"),
		},

		// Its own declaration only (service.go).
		Declaration: declaration,
	}
}

// inboxCommand runs an operator command. Holding the database credentials is
// the privilege; --ticket and --actor make each change audited.
func inboxCommand(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
	dsn := env.Required("DATABASE_URL")
	psCfg := libenv.PubSub(env)
	recvCfg := receiver.ConfigFromEnv(env, "WORKORDER_RECEIVER_")
	if err := env.Err(); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	deps := admin.Deps{Pool: pool, Receiver: recvCfg, Logger: logger}
	// Only dead-letter replay needs Pub/Sub; other commands work without it.
	if len(args) > 0 && args[0] == "replay-dead-letters" {
		ps, err := libenv.PubSubClient(ctx, psCfg)
		if err != nil {
			return err
		}
		defer ps.Close()
		deps.PubSub = ps
	}
	ops, err := admin.NewOps(deps)
	if err != nil {
		return err
	}
	return admin.RunCLI(ctx, args, ops, os.Stdout)
}

// operatorCommand runs `workorder <group> ...`, a command of the one
// operator API (operator.RunCLI: outbox, parked, dead-letters, audit) over
// the work-order database, in process: holding DATABASE_URL is the
// privilege (the binary could change these tables directly), so the calls
// skip the operator token, the network's credential, exactly as this
// command line always did; --ticket and --actor make each repair audited.
// The InvoiceIssued consumer is configured as the running one; only the
// dead-letter replay needs Pub/Sub.
func operatorCommand(group string) servicecmd.Command {
	return func(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
		return runOperatorCLI(ctx, env, logger, append([]string{group}, args...))
	}
}

// invoicingCommand keeps `workorder invoicing replay|replay-dead-letters`,
// the former names of `workorder parked replay` and `workorder dead-letters
// replay`.
func invoicingCommand(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "replay":
			args = append([]string{"parked", "replay"}, args[1:]...)
		case "replay-dead-letters":
			args = append([]string{"dead-letters", "replay"}, args[1:]...)
		}
	}
	return runOperatorCLI(ctx, env, logger, args)
}

func runOperatorCLI(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
	dsn := env.Required("DATABASE_URL")
	maxPayload := env.Int("WORKORDER_INVOICING_MAX_PAYLOAD_BYTES", invoicing.DefaultMaxPayloadBytes)
	psCfg := libenv.PubSub(env)
	if err := env.Err(); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	var ps *gpubsub.Client
	if len(args) > 0 && args[0] == "dead-letters" {
		if ps, err = libenv.PubSubClient(ctx, psCfg); err != nil {
			return err
		}
		defer func() { _ = ps.Close() }()
	}
	inv, err := invoicing.New(pool, invoicing.Config{MaxPayloadBytes: maxPayload}, logger, nil)
	if err != nil {
		return err
	}
	deps, err := admin.OperatorDeps(pool, inv, ps, logger)
	if err != nil {
		return err
	}
	ops, err := operator.NewInProcess(deps)
	if err != nil {
		return err
	}
	return operator.RunCLI(ctx, args, ops, admin.ConsumerInvoicing, os.Stdout)
}
