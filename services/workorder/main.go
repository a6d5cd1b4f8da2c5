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
//	workorder inbox|outbox|parked|dead-letters|audit ...
//	                    the operator commands every service has (pkg/operator RunCLI: inbox
//	                    list|show|replay|cleanup, outbox list|requeue, parked list|replay,
//	                    dead-letters replay [--consumer inbox|invoicing], audit list) over the
//	                    inbox, the outbox and the two consumers; see
//	                    docs/runbooks/repair-parked-inbox-entries.md, docs/runbooks/outbox-relay-stalled.md,
//	                    docs/runbooks/replay-dead-letter-events.md
//	workorder orders re-hand-off
//	                    record another waiting point for a handed-off order (F7)
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
		Name:        config.ServiceName,
		Usage:       "usage: workorder [serve|migrate|provision|inbox|outbox|parked|dead-letters|audit|orders|invoicing]  (configuration from the environment: services/workorder/internal/config)",
		Config:      config.FromEnv,
		Sections:    func(c *config.Config) (*server.Config, telemetry.Config) { return &c.Server, c.Telemetry },
		New:         app.New,
		Declaration: declaration, // its own service.json only (service.go)
		Commands: map[string]servicecmd.Command{
			"orders":    ordersCommand,
			"invoicing": invoicingCommand,
		},
	}, serviceapp.Commands[config.Config]{
		PubSub:     func(c *config.Config) *pubsub.ClientConfig { return &c.PubSub },
		Migrations: migrations.WorkOrder(),
		Operator:   openOperator,
	})
}

// ordersCommand runs `workorder orders re-hand-off`, the service's own
// repair. Holding the database credentials is the privilege; --ticket and
// --actor make it audited.
func ordersCommand(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
	pool, err := serviceapp.OpenDatabase(ctx, env)
	if err != nil {
		return err
	}
	defer pool.Close()
	ops, err := admin.NewOps(pool, logger)
	if err != nil {
		return err
	}
	return admin.RunOrdersCLI(ctx, args, ops, os.Stdout)
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
// line: the one operator API (inbox, outbox, parked, dead-letters, audit)
// over the work-order database, the InvoiceIssued consumer and the receiver
// configured as the running ones.
func openOperator(_ context.Context, env *envconfig.Reader, pool *pgxpool.Pool, ps *gpubsub.Client, logger *slog.Logger) (operator.Operations, string, error) {
	maxPayload := env.Int("WORKORDER_INVOICING_MAX_PAYLOAD_BYTES", invoicing.DefaultMaxPayloadBytes)
	recvCfg := receiver.ConfigFromEnv(env, "WORKORDER_RECEIVER_")
	if err := env.Err(); err != nil {
		return nil, "", err
	}
	inv, err := invoicing.New(pool, invoicing.Config{MaxPayloadBytes: maxPayload}, logger, nil)
	if err != nil {
		return nil, "", err
	}
	deps, err := admin.OperatorDeps(pool, inv, recvCfg, ps, logger)
	if err != nil {
		return nil, "", err
	}
	ops, err := operator.NewInProcess(deps)
	return ops, admin.ConsumerInvoicing, err
}
