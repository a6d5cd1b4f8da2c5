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
//	workorder invoicing ... operator commands on the InvoiceIssued consumer
//	                    (replay --id N of a parked message, replay-dead-letters);
//	                    see docs/runbooks/replay-dead-letter-events.md
//	workorder outbox requeue --ticket T --actor A --ids <uuid,...> [--dry-run]
//	                    requeue FAILED outbox events; see
//	                    docs/runbooks/outbox-relay-stalled.md
//
// Configuration comes from the environment; see internal/config.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/servicecmd"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/envconfig"
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
		Usage:      "usage: workorder [serve|migrate|provision|inbox|invoicing|outbox]  (configuration from the environment: services/workorder/internal/config)",
		Config:     config.FromEnv,
		Sections:   func(c *config.Config) (*server.Config, telemetry.Config) { return &c.Server, c.Telemetry },
		New:        app.New,
		Migrations: migrations.WorkOrder(),
		Commands: map[string]servicecmd.Command{
			"inbox":     inboxCommand,
			"invoicing": invoicingCommand,
			"outbox":    outboxCommand,
		},
	}
}

// inboxCommand runs an operator command. Holding the database credentials is
// the privilege; --ticket and --actor make each change audited.
func inboxCommand(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
	dsn := env.Required("DATABASE_URL")
	psCfg := pubsub.ClientConfigFromEnv(env)
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
		ps, err := pubsub.NewClient(ctx, psCfg)
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

// invoicingCommand runs an operator command of the InvoiceIssued consumer:
// replay a parked message (parked_messages) or the dead letters of
// workorder.billing-events, through the consumer's normal path; ticket and
// actor are recorded with each.
func invoicingCommand(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
	dsn := env.Required("DATABASE_URL")
	maxPayload := env.Int("WORKORDER_INVOICING_MAX_PAYLOAD_BYTES", invoicing.DefaultMaxPayloadBytes)
	psCfg := pubsub.ClientConfigFromEnv(env)
	if err := env.Err(); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	deps := admin.Deps{Pool: pool, Invoicing: invoicing.Config{MaxPayloadBytes: maxPayload}, Logger: logger}
	// Only dead-letter replay needs Pub/Sub.
	if len(args) > 0 && args[0] == "replay-dead-letters" {
		ps, err := pubsub.NewClient(ctx, psCfg)
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
	return admin.RunInvoicingCLI(ctx, args, ops, os.Stdout)
}

// outboxCommand runs an operator command on the outbox (requeue FAILED
// events); ticket and actor are recorded in operator_audit and on the rows.
func outboxCommand(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
	dsn := env.Required("DATABASE_URL")
	if err := env.Err(); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	ops, err := admin.NewOps(admin.Deps{Pool: pool, Logger: logger})
	if err != nil {
		return err
	}
	return admin.RunOutboxCLI(ctx, args, ops, os.Stdout)
}
