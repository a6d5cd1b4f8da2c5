// Package config is the work-order service's configuration, read from the
// environment. Every variable, its default and its reason are documented on
// the field it fills; a bad or missing value stops the process at start-up
// with an error naming the variable.
package config

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// Config of the work-order service.
type Config struct {
	// Common is what every service reads the same way (see
	// serviceapp.Common): DATABASE_* (DATABASE_API_MAX_CONNS default 10,
	// DATABASE_WORKER_MAX_CONNS 12), the listeners (GRPC_ADDR default
	// ":9090", HTTP_ADDR default ":8080", ADMIN_GRPC_ADDR ":9190",
	// ADMIN_HTTP_ADDR ":8180"; the same TLS dials
	// PROVIDER_ADDR), PUBSUB_* (PUBSUB_MAX_BATCH_BYTES bounds a batch of
	// either consumer, PUBSUB_BATCH_CONCURRENCY their batches in flight),
	// AUTH_*, WORKORDER_OPERATOR_TOKEN (guards
	// WorkOrderAdminService and OperatorService) and the telemetry. Here
	// DATABASE_PLAN_CACHE_MODE defaults to force_generic_plan, where the
	// other services keep the server's auto: every statement of this
	// service is written to be served by one generic plan, and under auto
	// its batch statements were planned again on every call (ADR 0002,
	// revision 6).
	serviceapp.Common

	// ProviderAddr is the provider's gRPC address (env PROVIDER_ADDR, default
	// "localhost:9091", the simulator's default port). Dialled with
	// Server.TLS: TLS when TLS_CA_FILE or TLS_CERT_FILE is set, presenting
	// TLS_CERT_FILE to a provider that requires a client certificate.
	ProviderAddr string

	// OperatorSubjects are the caller subjects that may read, list and
	// cancel every order (env WORKORDER_OPERATOR_SUBJECTS, comma-separated,
	// default none: every caller sees only its own orders), e.g. the
	// console's. They are clients of every customer, whether AUTH_CLIENTS
	// lists them or not (docs/adr/0025-authorization.md).
	OperatorSubjects []string

	// ProviderAuth is this service's ID token for the provider's
	// SubmitWorkOrder: PROVIDER_AUDIENCE (default "provider-sim", the
	// provider's AUTH_AUDIENCE), and AUTH_TOKEN_URL, AUTH_CLIENT_ID,
	// AUTH_CLIENT_SECRET (unset: Google ID tokens of the workload's service
	// account). See internal/clientauth.
	ProviderAuth clientauth.Config

	// HandOff configures the hand-off dispatcher: WORKORDER_HANDOFF_DEADLINE
	// (default 10s) bounds one SubmitWorkOrder call.
	HandOff handoff.Config

	// Outbox configures the outbox relay: WORKORDER_OUTBOX_* (BATCH_SIZE,
	// BATCHES_IN_FLIGHT, POLL_INTERVAL, LEASE_DURATION, BACKOFF_BASE, BACKOFF_MAX, MAX_ATTEMPTS,
	// CIRCUIT_THRESHOLD, CIRCUIT_PROBE_INTERVAL(_MAX), RETENTION, ...; see
	// libenv.Outbox and outbox.Config for defaults).
	Outbox outbox.Config

	// Idempotency configures API idempotency keys:
	// WORKORDER_IDEMPOTENCY_RETENTION (default 24h, see
	// docs/adr/0003-api-idempotency-keys.md), WORKORDER_IDEMPOTENCY_CLEANUP_INTERVAL
	// (default 5m) and WORKORDER_IDEMPOTENCY_CLEANUP_BATCH (default 1000).
	Idempotency idempotency.Config

	// Receiver configures the decoding of provider completions:
	// WORKORDER_RECEIVER_MAX_PAYLOAD_BYTES (default 1 MiB; a larger payload
	// is parked as poison with its raw bytes).
	Receiver receiver.Config

	// Invoicing configures the InvoiceIssued consumer:
	// WORKORDER_INVOICING_MAX_PAYLOAD_BYTES (default 1 MiB; larger payloads
	// are parked with their raw bytes) and WORKORDER_INVOICING_CONCURRENCY
	// (default 4: after a batch's transaction failed, how many of its
	// messages are applied at once, each in its own transaction and pooled
	// connection; pkg/consumer).
	Invoicing invoicing.Config

	// Inbox configures the correlation relay of provider completions:
	// WORKORDER_INBOX_* (see libenv.Inbox and inbox.Config; the
	// reasoning is in docs/adr/0008-error-classification-and-backoff.md).
	Inbox inbox.Config
}

// ServiceName is the telemetry service name.
const ServiceName = "workorder"

// EnvOperatorToken names the operator token's variable.
const EnvOperatorToken = "WORKORDER_OPERATOR_TOKEN"

// DefaultPlanCacheMode is workorder's DATABASE_PLAN_CACHE_MODE default.
const DefaultPlanCacheMode = "force_generic_plan"

// FromEnv reads the configuration from r and validates it. The error names
// every bad variable at once.
func FromEnv(r *envconfig.Reader) (Config, error) {
	c := Config{
		Common: serviceapp.ReadCommon(r, serviceapp.Defaults{
			Service: ServiceName, GRPCAddr: ":9090", HTTPAddr: ":8080", AdminGRPCAddr: ":9190", AdminHTTPAddr: ":8180",
			Database: pgdb.Config{PlanCacheMode: DefaultPlanCacheMode},
		}),
		ProviderAddr:     r.String("PROVIDER_ADDR", "localhost:9091"),
		OperatorSubjects: libenv.SplitSubjects(r.String("WORKORDER_OPERATOR_SUBJECTS", "")),
		ProviderAuth:     clientauth.FromEnv(r, "PROVIDER_AUDIENCE", "provider-sim"),
		HandOff:          handoff.Config{Deadline: r.Duration("WORKORDER_HANDOFF_DEADLINE", handoff.DefaultDeadline)},
		Outbox:           libenv.Outbox(r, "WORKORDER_OUTBOX_"),
		Idempotency: idempotency.Config{
			Retention:       r.Duration("WORKORDER_IDEMPOTENCY_RETENTION", 24*time.Hour),
			CleanupInterval: r.Duration("WORKORDER_IDEMPOTENCY_CLEANUP_INTERVAL", 5*time.Minute),
			CleanupBatch:    r.Int("WORKORDER_IDEMPOTENCY_CLEANUP_BATCH", 1000),
		},
		Receiver: receiver.ConfigFromEnv(r, "WORKORDER_RECEIVER_"),
		Invoicing: invoicing.Config{
			MaxPayloadBytes: r.Int("WORKORDER_INVOICING_MAX_PAYLOAD_BYTES", invoicing.DefaultMaxPayloadBytes),
			Concurrency:     r.Int("WORKORDER_INVOICING_CONCURRENCY", invoicing.DefaultConcurrency),
		},
		Inbox: libenv.Inbox(r, "WORKORDER_INBOX_"),
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
	errs := []error{c.Common.Validate()}
	if c.ProviderAddr == "" {
		errs = append(errs, errors.New("PROVIDER_ADDR: must not be empty"))
	}
	errs = append(errs,
		c.ProviderAuth.Validate(),
		envconfig.Check("WORKORDER_RECEIVER_*", c.Receiver.Validate()),
		envconfig.Check("WORKORDER_INVOICING_*", c.Invoicing.Validate()),
		envconfig.Check("WORKORDER_INBOX_*", c.Inbox.Validate()),
		envconfig.Check("WORKORDER_HANDOFF_DEADLINE", c.HandOff.Validate()),
		envconfig.Check("WORKORDER_OUTBOX_*", c.Outbox.Validate()),
		envconfig.Check("WORKORDER_IDEMPOTENCY_*", c.Idempotency.Validate()),
	)
	if lease := cmp.Or(c.Outbox.LeaseDuration, outbox.DefaultLeaseDuration); c.HandOff.Deadline >= lease*8/10 {
		errs = append(errs, fmt.Errorf("WORKORDER_HANDOFF_DEADLINE: %v must be below 80%% of WORKORDER_OUTBOX_LEASE_DURATION (%v), where the relay cuts a dispatch off", c.HandOff.Deadline, lease))
	}
	// A hand-off in flight at SIGTERM is finished, not abandoned (package
	// handoff), so it must fit in the shutdown.
	if st := c.Server.ShutdownTimeout; st > 0 && c.HandOff.Deadline >= st {
		errs = append(errs, fmt.Errorf("WORKORDER_HANDOFF_DEADLINE: %v must be below SHUTDOWN_TIMEOUT (%v), so an in-flight hand-off finishes during shutdown", c.HandOff.Deadline, st))
	}
	return errors.Join(errs...)
}
