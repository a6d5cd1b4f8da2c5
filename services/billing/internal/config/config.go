// Package config is the billing service's configuration, read from the
// environment. Every variable, its default and its reason are documented on
// the field it fills; a bad or missing value stops the process at start-up
// with an error naming the variable.
package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

// ServiceName is the telemetry service name.
const ServiceName = "billing"

// QueueName is the invoice jobs' queue in the leasequeue_jobs table.
const QueueName = "invoices"

// Billing's pool sizes, where they differ from pkg/pgdb's defaults.
const (
	DefaultAPIMaxConns    = 5
	DefaultWorkerMaxConns = 16
)

// EnvOperatorToken names the operator token's variable.
const EnvOperatorToken = "BILLING_OPERATOR_TOKEN"

// Config of the billing service.
type Config struct {
	// Common is what every service reads the same way (see
	// serviceapp.Common): DATABASE_*, the listeners (GRPC_ADDR default
	// ":9092", HTTP_ADDR default ":8082", ADMIN_GRPC_ADDR ":9192",
	// ADMIN_HTTP_ADDR ":8182"), PUBSUB_*, AUTH_* (every
	// authenticated caller may read invoices), BILLING_OPERATOR_TOKEN
	// (guards OperatorService) and the telemetry.
	// The pools: DATABASE_API_MAX_CONNS (default 5 here: the read API runs
	// one short statement per request) and DATABASE_WORKER_MAX_CONNS
	// (default 16 here: the invoice worker holds one connection for LISTEN
	// and up to BILLING_JOBS_COMPLETERS for completions, the consumer and
	// the relay one per batch in flight).
	serviceapp.Common

	// Outbox configures the InvoiceIssued relay: BILLING_OUTBOX_* (see
	// libenv.Outbox for names and defaults).
	Outbox outbox.Config

	// Queue configures the invoice jobs' leases:
	//   BILLING_JOBS_LEASE (default 30s): how long a claim holds a job without
	//     a heartbeat; a dead worker's job is redone after it.
	//   BILLING_JOBS_BACKOFF_BASE (1s) / BILLING_JOBS_BACKOFF_MAX (5m): retry
	//     spacing of failed attempts (full jitter).
	Queue leasequeue.Config

	// Clock stamps leases, due times and invoices. Not read from the
	// environment: nil means time.Now; tests inject a fake clock to expire
	// leases without sleeping.
	Clock func() time.Time

	// Worker configures the invoice worker:
	//   BILLING_JOBS_WORKERS (default 10): invoices issued concurrently.
	//   BILLING_JOBS_POLL_INTERVAL (1s): idle poll, when no NOTIFY arrives.
	//   BILLING_JOBS_RESCUE_INTERVAL (1s): how often expired leases are taken over.
	//   BILLING_JOBS_HEARTBEAT_INTERVAL (lease/3).
	//   BILLING_JOBS_SHUTDOWN_GRACE (10s): running invoices may finish for this
	//     long on SIGTERM; then they are released. Below SHUTDOWN_TIMEOUT.
	//   BILLING_JOBS_COMPLETERS (8) / BILLING_JOBS_COMPLETE_BATCH (32): fenced
	//     completion transactions in flight and jobs per transaction. An
	//     invoice's effects are a few statements run one after another inside
	//     its batch's transaction, so parallel small batches beat one large one
	//     (B3: 2 × 256 gave 1.2k invoices/s, 8 × 32 gave 2.6k on 2 cores).
	//   INSTANCE_ID (default "": none): this process's name across restarts
	//     (a pod name, "billing-1"); unique among live replicas. When set, a
	//     restarted instance redoes the jobs its dead predecessor held at once
	//     instead of after their lease (leasequeue.WorkerConfig.Instance).
	Worker leasequeue.WorkerConfig

	// JobMaxAttempts is each invoice job's attempt budget
	// (BILLING_JOBS_MAX_ATTEMPTS, default 10: with the default backoff about
	// half an hour of retries) before it is parked for an operator.
	JobMaxAttempts int

	// ProcessedEvents configures the Cleaner of the consumer's markers (pkg/consumer):
	// BILLING_PROCESSED_EVENTS_RETENTION (default 336h = 14 days: twice the
	// subscription's 7-day message retention, the longest Pub/Sub redelivers),
	// BILLING_PROCESSED_EVENTS_CLEANUP_INTERVAL (1h) and
	// BILLING_PROCESSED_EVENTS_CLEANUP_BATCH (5000).
	ProcessedEvents consumer.CleanerConfig

	// IntakeMaxPayloadBytes caps a workorder-events message's payload
	// (BILLING_INTAKE_MAX_PAYLOAD_BYTES, default 1 MiB); larger ones are
	// parked with their raw bytes.
	IntakeMaxPayloadBytes int
}

// FromEnv reads the configuration from r and validates it.
func FromEnv(r *envconfig.Reader) (Config, error) {
	lease := r.Duration("BILLING_JOBS_LEASE", 30*time.Second)
	c := Config{
		Common: serviceapp.ReadCommon(r, serviceapp.Defaults{
			Service: ServiceName, GRPCAddr: ":9092", HTTPAddr: ":8082", AdminGRPCAddr: ":9192", AdminHTTPAddr: ":8182",
			Database: pgdb.Config{APIMaxConns: DefaultAPIMaxConns, WorkerMaxConns: DefaultWorkerMaxConns},
		}),
		Outbox: libenv.Outbox(r, "BILLING_OUTBOX_"),
		Queue: leasequeue.Config{
			Name:          QueueName,
			LeaseDuration: lease,
			Backoff: retry.Backoff{
				Base: r.Duration("BILLING_JOBS_BACKOFF_BASE", time.Second),
				Max:  r.Duration("BILLING_JOBS_BACKOFF_MAX", 5*time.Minute),
			},
		},
		Worker: leasequeue.WorkerConfig{
			Instance:          r.String("INSTANCE_ID", ""),
			Workers:           r.Int("BILLING_JOBS_WORKERS", 10),
			PollInterval:      r.Duration("BILLING_JOBS_POLL_INTERVAL", time.Second),
			RescueInterval:    r.Duration("BILLING_JOBS_RESCUE_INTERVAL", time.Second),
			HeartbeatInterval: r.Duration("BILLING_JOBS_HEARTBEAT_INTERVAL", lease/3),
			ShutdownGrace:     r.Duration("BILLING_JOBS_SHUTDOWN_GRACE", 10*time.Second),
			Completers:        r.Int("BILLING_JOBS_COMPLETERS", 8),
			CompleteBatch:     r.Int("BILLING_JOBS_COMPLETE_BATCH", 32),
		},
		JobMaxAttempts: r.Int("BILLING_JOBS_MAX_ATTEMPTS", leasequeue.DefaultMaxAttempts),
		ProcessedEvents: consumer.CleanerConfig{
			Retention: r.Duration("BILLING_PROCESSED_EVENTS_RETENTION", 14*24*time.Hour),
			Interval:  r.Duration("BILLING_PROCESSED_EVENTS_CLEANUP_INTERVAL", time.Hour),
			BatchSize: r.Int("BILLING_PROCESSED_EVENTS_CLEANUP_BATCH", 5000),
		},
		IntakeMaxPayloadBytes: r.Int("BILLING_INTAKE_MAX_PAYLOAD_BYTES", intake.DefaultMaxPayloadBytes),
	}
	c.OperatorToken = r.String(EnvOperatorToken, "")
	if err := r.Err(); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate reports settings that cannot work, naming the variable.
func (c Config) Validate() error {
	c.OperatorTokenEnv = EnvOperatorToken
	errs := []error{c.Common.Validate(),
		envconfig.Check("BILLING_INTAKE_MAX_PAYLOAD_BYTES", intake.Config{MaxPayloadBytes: c.IntakeMaxPayloadBytes}.Validate()),
		envconfig.Check("BILLING_OUTBOX_*", c.Outbox.Validate()),
		envconfig.Check("BILLING_JOBS_LEASE / BILLING_JOBS_BACKOFF_*", c.Queue.Validate()),
		envconfig.Check("BILLING_JOBS_* / INSTANCE_ID", c.Worker.ValidateFor(c.Queue)),
		envconfig.Check("BILLING_PROCESSED_EVENTS_*", c.ProcessedEvents.Validate()),
	}
	if c.JobMaxAttempts < 1 || c.JobMaxAttempts > 1000 {
		errs = append(errs, fmt.Errorf("BILLING_JOBS_MAX_ATTEMPTS: %d, want 1..1000", c.JobMaxAttempts))
	}
	if c.Server.ShutdownTimeout > 0 && c.Worker.ShutdownGrace >= c.Server.ShutdownTimeout {
		errs = append(errs, fmt.Errorf("BILLING_JOBS_SHUTDOWN_GRACE: %v must be below SHUTDOWN_TIMEOUT (%v), or releases are cut off", c.Worker.ShutdownGrace, c.Server.ShutdownTimeout))
	}
	return errors.Join(errs...)
}
