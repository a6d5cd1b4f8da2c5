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
	"log/slog"
	"os"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/serviceapp"
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
	return serviceapp.CommandLine(servicecmd.Service[config.Config, *app.App]{
		Name:     config.ServiceName,
		Usage:    "usage: workorder [serve|migrate|provision|inbox|outbox|parked|dead-letters|audit|invoicing]  (configuration from the environment: services/workorder/internal/config)",
		Config:   config.FromEnv,
		Sections: func(c *config.Config) (*server.Config, telemetry.Config) { return &c.Server, c.Telemetry },
		New:      app.New,
		Commands: map[string]servicecmd.Command{
			"inbox":     inboxCommand,
			"invoicing": invoicingCommand,
		},
	}, serviceapp.Commands[config.Config]{
		PubSub:     func(c *config.Config) *pubsub.ClientConfig { return &c.PubSub },
		Migrations: migrations.WorkOrder(),
		Operator:   openOperator,
	})
}

// inboxCommand runs an operator command. Holding the database credentials is
// the privilege; --ticket and --actor make each change audited.
func inboxCommand(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
	psCfg := libenv.PubSub(env)
	recvCfg := receiver.ConfigFromEnv(env, "WORKORDER_RECEIVER_")
	pool, err := serviceapp.OpenDatabase(ctx, env)
	if err != nil {
		return err
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
	return serviceapp.OperatorCommand(openOperator)(ctx, env, logger, args)
}

// openOperator is the work-order service's operator hook on the command
// line: the one operator API (outbox, parked, dead-letters, audit) over the
// work-order database, the InvoiceIssued consumer configured as the running
// one.
func openOperator(_ context.Context, env *envconfig.Reader, pool *pgxpool.Pool, ps *gpubsub.Client, logger *slog.Logger) (operator.Operations, string, error) {
	maxPayload := env.Int("WORKORDER_INVOICING_MAX_PAYLOAD_BYTES", invoicing.DefaultMaxPayloadBytes)
	if err := env.Err(); err != nil {
		return nil, "", err
	}
	inv, err := invoicing.New(pool, invoicing.Config{MaxPayloadBytes: maxPayload}, logger, nil)
	if err != nil {
		return nil, "", err
	}
	deps, err := admin.OperatorDeps(pool, inv, ps, logger)
	if err != nil {
		return nil, "", err
	}
	ops, err := operator.NewInProcess(deps)
	return ops, admin.ConsumerInvoicing, err
}
