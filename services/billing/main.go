// Command billing is the billing service: it consumes the work-order
// service's completion events idempotently, issues exactly one invoice per
// work order with a leased, fenced worker, publishes InvoiceIssued through
// its outbox, and serves the invoices over gRPC and REST.
//
// Usage:
//
//	billing [serve [--role api|worker|all]]
//	                       serve gRPC :9092 and REST :8082 and run the consumer, invoice worker and relay (default;
//	                       role also from SERVICE_ROLE, see docs/adr/0013-api-and-worker-roles.md)
//	billing migrate        apply the database migrations and exit
//	billing provision      create the Pub/Sub topics and subscriptions (idempotent)
//	billing reconcile [-tolerance 5m] [-workorder-addr host:9090 -grace 10m]
//	                       print discrepancies as JSON lines; exit status 3 when any
//	billing outbox|parked|dead-letters|jobs|audit ...
//	                       the operator commands every service has (pkg/operator RunCLI: outbox
//	                       list|requeue, parked list|replay, dead-letters replay, jobs list|retry,
//	                       audit list) over the outbox, the intake and the invoice jobs; audited in
//	                       operator_audit (jobs retry also in leasequeue_job_audit)
//	                       (docs/runbooks/replay-dead-letter-events.md, docs/runbooks/outbox-relay-stalled.md)
//
// Configuration comes from the environment; see internal/config. The operator
// commands need only DATABASE_URL (and, for the cross-service check, the
// work-order gRPC address, dialled with TLS when TLS_CA_FILE is set,
// presenting TLS_CERT_FILE/TLS_KEY_FILE when set).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/internal/servicecmd"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/billing/internal/admin"
	"github.com/lossless-dev/lossless/services/billing/internal/app"
	"github.com/lossless-dev/lossless/services/billing/internal/config"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
	"github.com/lossless-dev/lossless/services/billing/internal/reconcile"
)

// errDiscrepancies makes `billing reconcile` exit with status 3, so a cron
// job or a CI step can alert on it.
var errDiscrepancies = &server.ExitError{Code: 3, Err: errors.New("discrepancies found")}

func main() { os.Exit(servicecmd.Main(service())) }

// service is the billing service's command line (internal/servicecmd).
func service() servicecmd.Service[config.Config, *app.App] {
	return serviceapp.CommandLine(servicecmd.Service[config.Config, *app.App]{
		Name:        config.ServiceName,
		Usage:       `usage: billing [serve|migrate|provision|reconcile|outbox list|outbox requeue|parked list|parked replay|dead-letters replay|jobs list|jobs retry|audit list] (see services/billing/main.go)`,
		Config:      config.FromEnv,
		Sections:    func(c *config.Config) (*server.Config, telemetry.Config) { return &c.Server, c.Telemetry },
		New:         app.New,
		Declaration: declaration, // its own service.json only (service.go)
		Commands: map[string]servicecmd.Command{
			"reconcile": reconcileCmd,
		},
	}, serviceapp.Commands[config.Config]{
		PubSub:     func(c *config.Config) *pubsub.ClientConfig { return &c.PubSub },
		Migrations: migrations.Billing(),
		Operator:   openOperator,
	})
}

func reconcileCmd(ctx context.Context, env *envconfig.Reader, _ *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("billing reconcile", flag.ContinueOnError)
	tolerance := fs.Duration("tolerance", 5*time.Minute, "age after which an expired lease or a waiting job counts")
	woAddr := fs.String("workorder-addr", "", "work-order gRPC address (host:port); set to also compare with the work-order service")
	grace := fs.Duration("grace", 10*time.Minute, "cross-service check: orders changed more recently than this are in flight, not discrepancies")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, err := serviceapp.OpenDatabase(ctx, env)
	if err != nil {
		return err
	}
	defer pool.Close()
	found, err := reconcile.Local(ctx, pool, config.QueueName, time.Now(), *tolerance)
	if err != nil {
		return err
	}
	if *woAddr != "" {
		// The cross check lists every order: billing's subject must be one
		// of the work-order service's WORKORDER_OPERATOR_SUBJECTS.
		woAuth := clientauth.FromEnv(env, "WORKORDER_AUDIENCE", "workorder")
		if err := errors.Join(env.Err(), woAuth.Validate()); err != nil {
			return err
		}
		token, err := woAuth.DialOption(ctx)
		if err != nil {
			return err
		}
		clientTLS, err := libenv.NewTLS(env)
		if err != nil {
			return err
		}
		conn, err := grpc.NewClient(*woAddr, clientTLS.DialOption(), server.ClientKeepalive(), token)
		if err != nil {
			return fmt.Errorf("-workorder-addr: %w", err)
		}
		defer func() { _ = conn.Close() }()
		cross, err := reconcile.CrossService(ctx, pool, workorderv1.NewWorkOrderServiceClient(conn), time.Now(), *grace)
		if err != nil {
			return err
		}
		found = append(found, cross...)
	}
	enc := json.NewEncoder(os.Stdout)
	for _, d := range found {
		if err := enc.Encode(d); err != nil {
			return err
		}
	}
	if len(found) > 0 {
		return errDiscrepancies
	}
	return nil
}

// openOperator is billing's operator hook on the command line: the one
// operator API (outbox, parked, dead-letters, jobs, audit) over the billing
// database. The intake is configured as the running consumer's (the same
// payload cap and job attempt budget).
func openOperator(_ context.Context, env *envconfig.Reader, pool *pgxpool.Pool, ps *gpubsub.Client, logger *slog.Logger) (operator.Operations, string, error) {
	inCfg := intake.Config{
		JobMaxAttempts:  env.Int("BILLING_JOBS_MAX_ATTEMPTS", leasequeue.DefaultMaxAttempts),
		MaxPayloadBytes: env.Int("BILLING_INTAKE_MAX_PAYLOAD_BYTES", intake.DefaultMaxPayloadBytes),
	}
	if err := env.Err(); err != nil {
		return nil, "", err
	}
	q, err := leasequeue.New(pool, leasequeue.Config{Name: config.QueueName}, logger, nil)
	if err != nil {
		return nil, "", err
	}
	in, err := intake.New(pool, q, inCfg, logger, nil)
	if err != nil {
		return nil, "", err
	}
	deps, err := admin.OperatorDeps(pool, q, in, ps, logger)
	if err != nil {
		return nil, "", err
	}
	ops, err := operator.NewInProcess(deps)
	return ops, admin.ConsumerIntake, err
}
