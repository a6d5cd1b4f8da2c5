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
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// Config of the work-order service.
type Config struct {
	// Database is the service's own PostgreSQL database (env DATABASE_URL,
	// required, e.g. postgres://workorder:secret@localhost:5432/workorder)
	// and its bounds: DATABASE_STATEMENT_TIMEOUT (default 30s),
	// DATABASE_LOCK_TIMEOUT (10s), DATABASE_CONNECT_TIMEOUT (5s),
	// DATABASE_TCP_USER_TIMEOUT (10s), DATABASE_TCP_KEEPALIVE_IDLE (5s),
	// DATABASE_TCP_KEEPALIVE_INTERVAL (1s), DATABASE_TCP_KEEPALIVE_COUNT (5),
	// DATABASE_API_MAX_CONNS (10) and DATABASE_WORKER_MAX_CONNS (12): the
	// API and the background loops have separate pools (see pkg/pgdb for
	// the reasoning and the connection arithmetic); and
	// DATABASE_PLAN_CACHE_MODE (default force_generic_plan, where the other
	// services keep the server's auto): every statement of this service is
	// written to be served by one generic plan, and under auto its batch
	// statements were planned again on every call (ADR 0002, revision 6).
	Database pgdb.Config

	// Server holds the listeners: GRPC_ADDR (default ":9090"), HTTP_ADDR
	// (default ":8080", REST gateway, /healthz, /readyz, /metrics),
	// SHUTDOWN_TIMEOUT (default 20s) and the request bounds
	// HTTP_MAX_BODY_BYTES (1 MiB), HTTP_READ_HEADER_TIMEOUT (5s),
	// HTTP_READ_TIMEOUT (15s), HTTP_WRITE_TIMEOUT (REQUEST_TIMEOUT + 5s),
	// HTTP_IDLE_TIMEOUT (60s) and REQUEST_TIMEOUT (10s), PPROF_ADDR ("":
	// no profiles; a loopback address such as 127.0.0.1:6060), and TLS:
	// TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE, TLS_CLIENT_AUTH (unset:
	// plaintext; the same TLS dials PROVIDER_ADDR); see server.Config and
	// server.TLSConfig.
	// The names are the same in every service: each process has its own
	// environment.
	Server server.Config

	// ProviderAddr is the provider's gRPC address (env PROVIDER_ADDR, default
	// "localhost:9091", the simulator's default port). Dialled with
	// Server.TLS: TLS when TLS_CA_FILE or TLS_CERT_FILE is set, presenting
	// TLS_CERT_FILE to a provider that requires a client certificate.
	ProviderAddr string

	// Auth authenticates the public API's callers: AUTH_ISSUER and
	// AUTH_AUDIENCE (required), AUTH_JWKS_URL (default: discovery),
	// AUTH_DISABLED (default false). See libenv.CallerAuth and
	// docs/adr/0017-caller-identity.md.
	Auth libenv.CallerAuth

	// OperatorSubjects are the caller subjects that may read, list and
	// cancel every order (env WORKORDER_OPERATOR_SUBJECTS, comma-separated,
	// default none: every caller sees only its own orders), e.g. the
	// console's.
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

	// PubSub is the Pub/Sub client: PUBSUB_PROJECT_ID (else
	// GOOGLE_CLOUD_PROJECT, else "lossless-local" on an emulator, else the
	// GCE/GKE metadata server's project, looked up at start) and
	// PUBSUB_EMULATOR_HOST (default "": real Pub/Sub).
	PubSub pubsub.ClientConfig

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

	// Subscriber tunes both consumers (pubsub.SubscriberConfig defaults):
	// PUBSUB_MAX_BATCH_BYTES (default 16 MiB) bounds the message bytes of
	// one batch handed to a consumer.
	Subscriber pubsub.SubscriberConfig

	// Inbox configures the correlation relay of provider completions:
	// WORKORDER_INBOX_* (see libenv.Inbox and inbox.Config; the
	// reasoning is in docs/adr/0008-error-classification-and-backoff.md).
	Inbox inbox.Config

	// OperatorToken guards the admin gRPC service (env
	// WORKORDER_OPERATOR_TOKEN, default "": the admin service refuses every
	// call). Callers send it as "authorization: Bearer <token>". When set it
	// must be at least operator.MinTokenLength (32) characters, e.g. the
	// output of `openssl rand -hex 32`.
	OperatorToken string

	// Telemetry: LOG_LEVEL (default info), LOG_FORMAT (default json; text;
	// gcp: Cloud Logging's fields, the trace field in the Pub/Sub project),
	// and the OpenTelemetry variables (OTEL_EXPORTER_OTLP_ENDPOINT, default
	// "": traces not exported; OTEL_EXPORTER_OTLP_HEADERS, _CERTIFICATE,
	// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, ...). See
	// telemetry.Config and docs/production.md.
	Telemetry telemetry.Config
}

// ServiceName is the telemetry service name.
const ServiceName = "workorder"

// DefaultPlanCacheMode is workorder's DATABASE_PLAN_CACHE_MODE default.
const DefaultPlanCacheMode = "force_generic_plan"

// FromEnv reads the configuration from r and validates it. The error names
// every bad variable at once.
func FromEnv(r *envconfig.Reader) (Config, error) {
	c := Config{
		Database:         libenv.Postgres(r, pgdb.Config{PlanCacheMode: DefaultPlanCacheMode}),
		Server:           libenv.Server(r, ":9090", ":8080"),
		ProviderAddr:     r.String("PROVIDER_ADDR", "localhost:9091"),
		Auth:             libenv.ReadCallerAuth(r),
		OperatorSubjects: libenv.SplitSubjects(r.String("WORKORDER_OPERATOR_SUBJECTS", "")),
		ProviderAuth:     clientauth.FromEnv(r, "PROVIDER_AUDIENCE", "provider-sim"),
		HandOff:          handoff.Config{Deadline: r.Duration("WORKORDER_HANDOFF_DEADLINE", handoff.DefaultDeadline)},
		Outbox:           libenv.Outbox(r, "WORKORDER_OUTBOX_"),
		Idempotency: idempotency.Config{
			Retention:       r.Duration("WORKORDER_IDEMPOTENCY_RETENTION", 24*time.Hour),
			CleanupInterval: r.Duration("WORKORDER_IDEMPOTENCY_CLEANUP_INTERVAL", 5*time.Minute),
			CleanupBatch:    r.Int("WORKORDER_IDEMPOTENCY_CLEANUP_BATCH", 1000),
		},
		PubSub:   libenv.PubSub(r),
		Receiver: receiver.ConfigFromEnv(r, "WORKORDER_RECEIVER_"),
		Invoicing: invoicing.Config{
			MaxPayloadBytes: r.Int("WORKORDER_INVOICING_MAX_PAYLOAD_BYTES", invoicing.DefaultMaxPayloadBytes),
			Concurrency:     r.Int("WORKORDER_INVOICING_CONCURRENCY", invoicing.DefaultConcurrency),
		},
		Inbox:         libenv.Inbox(r, "WORKORDER_INBOX_"),
		OperatorToken: r.String("WORKORDER_OPERATOR_TOKEN", ""),
		Telemetry:     libenv.Telemetry(r, ServiceName),
	}
	c.Telemetry.ProjectID = c.PubSub.ProjectID
	c.Subscriber = pubsub.DefaultSubscriberConfigFor(c.PubSub)
	c.Subscriber.MaxBatchBytes = r.Int("PUBSUB_MAX_BATCH_BYTES", c.Subscriber.MaxBatchBytes)
	if err := r.Err(); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate reports settings that cannot work, naming the variable.
func (c Config) Validate() error {
	errs := []error{c.Database.Validate()}
	errs = append(errs, operator.ValidateToken("WORKORDER_OPERATOR_TOKEN", c.OperatorToken))
	if c.ProviderAddr == "" {
		errs = append(errs, errors.New("PROVIDER_ADDR: must not be empty"))
	}
	errs = append(errs,
		c.Auth.Validate(),
		c.ProviderAuth.Validate(),
		envconfig.Check(libenv.ServerEnvNames, c.Server.Validate()),
		envconfig.Check("WORKORDER_RECEIVER_*", c.Receiver.Validate()),
		envconfig.Check("WORKORDER_INVOICING_*", c.Invoicing.Validate()),
		envconfig.Check("PUBSUB_MAX_BATCH_BYTES", c.Subscriber.Validate()),
		envconfig.Check("PUBSUB_*", c.PubSub.Validate()),
		envconfig.Check("WORKORDER_INBOX_*", c.Inbox.Validate()),
		envconfig.Check("WORKORDER_HANDOFF_DEADLINE", c.HandOff.Validate()),
		envconfig.Check("WORKORDER_OUTBOX_*", c.Outbox.Validate()),
		envconfig.Check("WORKORDER_IDEMPOTENCY_*", c.Idempotency.Validate()),
		c.Telemetry.Validate(),
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
