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
//	billing jobs list [-state dead] [-limit 100] [-before ID]
//	                       print invoice jobs as JSON lines, newest first
//	billing jobs retry -ticket T -actor A -id N [-id N ...]
//	                       requeue parked (dead) invoice jobs; audited in leasequeue_job_audit
//	billing reconcile [-tolerance 5m] [-workorder-addr host:9090 -grace 10m]
//	                       print discrepancies as JSON lines; exit status 3 when any
//	billing outbox|parked|dead-letters|audit ...
//	                       the operator commands every service has (pkg/operator RunCLI: outbox
//	                       list|requeue, parked list|replay, dead-letters replay, audit list) over the
//	                       outbox and the intake; audited in operator_audit
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
	return servicecmd.Service[config.Config, *app.App]{
		Name:       config.ServiceName,
		Usage:      `usage: billing [serve|migrate|provision|jobs list|jobs retry|reconcile|outbox list|outbox requeue|parked list|parked replay|dead-letters replay|audit list] (see services/billing/main.go)`,
		Config:     config.FromEnv,
		Sections:   func(c *config.Config) (*server.Config, telemetry.Config) { return &c.Server, c.Telemetry },
		PubSub:     func(c *config.Config) *pubsub.ClientConfig { return &c.PubSub },
		New:        app.New,
		Migrations: migrations.Billing(),
		Commands: map[string]servicecmd.Command{
			"jobs":         jobsCommand,
			"reconcile":    reconcileCmd,
			"dead-letters": operatorCommand("dead-letters"),
			"parked":       operatorCommand("parked"),
			"outbox":       operatorCommand("outbox"),
			"audit":        operatorCommand("audit"),
		},

		// Its own declaration only (service.go).
		Declaration: declaration,
	}
}

// jobsCommand runs `billing jobs list|retry`; retry goes through the intake.
func jobsCommand(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
	if len(args) == 0 {
		return errors.New("jobs: want list or retry")
	}
	if args[0] == "retry" {
		pool, q, err := openQueue(ctx, env, logger)
		if err != nil {
			return err
		}
		defer pool.Close()
		ops, err := admin.NewOps(pool, q, logger)
		if err != nil {
			return err
		}
		return admin.RunCLI(ctx, args, ops, os.Stdout)
	}
	return jobs(ctx, env, logger, args[0], args[1:])
}

func openQueue(ctx context.Context, env *envconfig.Reader, logger *slog.Logger) (*pgxpool.Pool, *leasequeue.Queue, error) {
	dsn := env.Required("DATABASE_URL")
	if err := env.Err(); err != nil {
		return nil, nil, err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	q, err := leasequeue.New(pool, leasequeue.Config{Name: config.QueueName}, logger, nil)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, q, nil
}

func jobs(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, sub string, args []string) error {
	fs := flag.NewFlagSet("billing jobs "+sub, flag.ContinueOnError)
	switch sub {
	case "list":
		state := fs.String("state", "", "available, running, done or dead (default all)")
		limit := fs.Int("limit", 100, "maximum jobs to print (at most 1000)")
		before := fs.Int64("before", 0, "only jobs with a smaller id (paging)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		pool, q, err := openQueue(ctx, env, logger)
		if err != nil {
			return err
		}
		defer pool.Close()
		js, err := q.List(ctx, pool, leasequeue.ListFilter{State: leasequeue.State(*state), Limit: *limit, BeforeID: *before})
		if err != nil {
			return err
		}
		enc := json.NewEncoder(os.Stdout)
		for _, j := range js {
			if err := enc.Encode(j); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("jobs %q: want list or retry", sub)
	}
}

func reconcileCmd(ctx context.Context, env *envconfig.Reader, _ *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("billing reconcile", flag.ContinueOnError)
	tolerance := fs.Duration("tolerance", 5*time.Minute, "age after which an expired lease or a waiting job counts")
	woAddr := fs.String("workorder-addr", "", "work-order gRPC address (host:port); set to also compare with the work-order service")
	grace := fs.Duration("grace", 10*time.Minute, "cross-service check: orders changed more recently than this are in flight, not discrepancies")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dsn := env.Required("DATABASE_URL")
	if err := env.Err(); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
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

// operatorCommand runs `billing <group> ...`, a command of the one operator
// API (operator.RunCLI: outbox, parked, dead-letters, audit) over the
// billing database, in process: holding DATABASE_URL is the privilege (the
// binary could change these tables directly), so the calls skip the
// operator token, the network's credential, exactly as this command line
// always did; -ticket and -actor make each repair audited. The intake is
// configured as the running consumer's (the same payload cap and job
// attempt budget); only the dead-letter replay needs Pub/Sub.
func operatorCommand(group string) servicecmd.Command {
	return func(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
		inCfg := intake.Config{
			JobMaxAttempts:  env.Int("BILLING_JOBS_MAX_ATTEMPTS", leasequeue.DefaultMaxAttempts),
			MaxPayloadBytes: env.Int("BILLING_INTAKE_MAX_PAYLOAD_BYTES", intake.DefaultMaxPayloadBytes),
		}
		psCfg := libenv.PubSub(env)
		pool, q, err := openQueue(ctx, env, logger)
		if err != nil {
			return err
		}
		defer pool.Close()
		in, err := intake.New(pool, q, inCfg, logger, nil)
		if err != nil {
			return err
		}
		var ps *gpubsub.Client
		if group == "dead-letters" {
			if ps, err = libenv.PubSubClient(ctx, psCfg); err != nil {
				return err
			}
			defer func() { _ = ps.Close() }()
		}
		deps, err := admin.OperatorDeps(pool, in, ps, logger)
		if err != nil {
			return err
		}
		ops, err := operator.NewInProcess(deps)
		if err != nil {
			return err
		}
		return operator.RunCLI(ctx, append([]string{group}, args...), ops, admin.ConsumerIntake, os.Stdout)
	}
}
