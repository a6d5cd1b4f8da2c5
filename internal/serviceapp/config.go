package serviceapp

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Common is the configuration every service with a database and Pub/Sub
// reads the same way; a service's config.Config embeds it and adds what is
// its own. The variable names are the same in every service: each process
// has its own environment.
type Common struct {
	// Database is the service's own PostgreSQL database (env DATABASE_URL,
	// required) and its bounds: DATABASE_STATEMENT_TIMEOUT (default 30s),
	// DATABASE_LOCK_TIMEOUT (10s), DATABASE_CONNECT_TIMEOUT (5s),
	// DATABASE_TCP_USER_TIMEOUT (10s), DATABASE_TCP_KEEPALIVE_IDLE (5s),
	// DATABASE_TCP_KEEPALIVE_INTERVAL (1s), DATABASE_TCP_KEEPALIVE_COUNT (5),
	// DATABASE_API_MAX_CONNS and DATABASE_WORKER_MAX_CONNS (the API and
	// the background loops have separate pools), DATABASE_PLAN_CACHE_MODE;
	// a service's defaults are its Defaults.Database. See pkg/pgdb for the
	// reasoning and the connection arithmetic.
	Database pgdb.Config

	// Server holds the listeners: GRPC_ADDR and HTTP_ADDR (REST gateway,
	// /healthz, /readyz, /metrics; defaults the service's Defaults),
	// SHUTDOWN_TIMEOUT (default 20s), SERVICE_ROLE (or serve --role), the
	// request bounds HTTP_MAX_BODY_BYTES (1 MiB), HTTP_READ_HEADER_TIMEOUT
	// (5s), HTTP_READ_TIMEOUT (15s), HTTP_WRITE_TIMEOUT (REQUEST_TIMEOUT +
	// 5s), HTTP_IDLE_TIMEOUT (60s) and REQUEST_TIMEOUT (10s), PPROF_ADDR
	// ("": no profiles; a loopback address such as 127.0.0.1:6060), and
	// TLS: TLS_CERT_FILE, TLS_KEY_FILE, TLS_CA_FILE, TLS_CLIENT_AUTH (unset:
	// plaintext); see server.Config and server.TLSConfig.
	Server server.Config

	// PubSub selects the Pub/Sub endpoint: PUBSUB_PROJECT_ID (else
	// GOOGLE_CLOUD_PROJECT, else "lossless-local" on an emulator, else the
	// GCE/GKE metadata server's project, looked up at start) and
	// PUBSUB_EMULATOR_HOST (default "": real Pub/Sub).
	PubSub pubsub.ClientConfig

	// Subscriber tunes the service's consumers
	// (pubsub.DefaultSubscriberConfigFor(PubSub)): PUBSUB_MAX_BATCH_BYTES
	// (default 16 MiB) bounds the message bytes of one batch handed to a
	// consumer; PUBSUB_BATCH_CONCURRENCY (default 2, at most maxBatchConcurrency)
	// is each consumer's batches in flight, each holding a worker-pool
	// connection for its transaction. A consumer applies a batch's messages
	// in turn, two round trips each, so far from its database (B7,
	// docs/performance.md) one loop takes at most 1 ÷ (2 × RTT) messages a
	// second: raise it there, below DATABASE_WORKER_MAX_CONNS.
	Subscriber pubsub.SubscriberConfig

	// Auth authenticates the callers of the public API: AUTH_ISSUER and
	// AUTH_AUDIENCE (required), AUTH_JWKS_URL (default: discovery),
	// AUTH_DISABLED (default false); and names its clients with their
	// customers: AUTH_CLIENTS (required). See libenv.CallerAuth,
	// docs/adr/0017-caller-identity.md and docs/adr/0025-authorization.md.
	// The operator services are exempt: the operator token guards them.
	Auth libenv.CallerAuth

	// Operators are the identities admitted to the operator services with
	// an ID token (AUTH_OPERATORS, AUTH_CONSOLES; default none). See
	// libenv.OperatorIdentities.
	Operators libenv.OperatorIdentities

	// OperatorToken is the break-glass token of the operator services (env
	// OperatorTokenEnv, e.g. BILLING_OPERATOR_TOKEN; default "": none),
	// recorded as "break-glass". Without it and without Operators they
	// refuse every call. The
	// service reads it, with its own constant: the deployment checks find
	// the names a binary reads by their literals and constants.
	// Callers send it as "authorization: Bearer <token>". When set, at
	// least operator.MinTokenLength (32) characters, e.g. the output of
	// `openssl rand -hex 32`. Pass it as a secret.
	OperatorToken string
	// OperatorTokenEnv is the variable OperatorToken is read from, named
	// in its errors.
	OperatorTokenEnv string

	// Telemetry: LOG_LEVEL (default info), LOG_FORMAT (default json; text;
	// gcp: Cloud Logging's fields, the trace field in the Pub/Sub project),
	// and the OpenTelemetry variables (OTEL_EXPORTER_OTLP_ENDPOINT, default
	// "": traces not exported; OTEL_EXPORTER_OTLP_HEADERS, _CERTIFICATE,
	// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, ...). See
	// telemetry.Config and docs/production.md.
	Telemetry telemetry.Config
}

// Defaults are where services differ in the common configuration.
type Defaults struct {
	// Service is the service's name (telemetry's service.name).
	Service string
	// GRPCAddr and HTTPAddr are the public listeners' default addresses,
	// AdminGRPCAddr and AdminHTTPAddr the admin ones (the operator
	// services, their gateway, /metrics).
	GRPCAddr, HTTPAddr           string
	AdminGRPCAddr, AdminHTTPAddr string
	// Database holds the service's pool defaults (zero: pkg/pgdb's).
	Database pgdb.Config
}

// ReadCommon reads the common configuration from r, but for the operator
// token (the service's own variable). Check r.Err() and Validate afterwards
// (the service's config.FromEnv does both).
func ReadCommon(r *envconfig.Reader, d Defaults) Common {
	c := Common{
		Database:  libenv.Postgres(r, d.Database),
		Server:    libenv.Server(r, libenv.Listeners{GRPC: d.GRPCAddr, HTTP: d.HTTPAddr, AdminGRPC: d.AdminGRPCAddr, AdminHTTP: d.AdminHTTPAddr}),
		PubSub:    libenv.PubSub(r),
		Auth:      libenv.ReadCallerAuth(r),
		Operators: libenv.ReadOperatorIdentities(r),
		Telemetry: libenv.Telemetry(r, d.Service),
	}
	c.Telemetry.ProjectID = c.PubSub.ProjectID
	c.Subscriber = pubsub.DefaultSubscriberConfigFor(c.PubSub)
	c.Subscriber.MaxBatchBytes = r.Int("PUBSUB_MAX_BATCH_BYTES", c.Subscriber.MaxBatchBytes)
	c.Subscriber.BatchConcurrency = r.Int(envBatchConcurrency, c.Subscriber.BatchConcurrency)
	return c
}

// envBatchConcurrency and its bound: 20 ms of round trip at B5's capacity
// (~240 orders/s) needs about 10 loops; far more would only queue for the
// worker pool's connections.
const (
	envBatchConcurrency = "PUBSUB_BATCH_CONCURRENCY"
	maxBatchConcurrency = 64
)

// Validate reports settings that cannot work, naming the variable.
func (c Common) Validate() error {
	return errors.Join(
		c.Database.Validate(),
		envconfig.Check(libenv.ServerEnvNames, c.Server.Validate()),
		envconfig.Check("PUBSUB_*", c.PubSub.Validate()),
		envconfig.Check("PUBSUB_MAX_BATCH_BYTES, "+envBatchConcurrency, c.Subscriber.Validate()),
		validateBatchConcurrency(c.Subscriber.BatchConcurrency),
		c.Auth.Validate(),
		c.Operators.Validate(c.Auth),
		operator.ValidateToken(cmp.Or(c.OperatorTokenEnv, "the operator token"), c.OperatorToken),
		c.Telemetry.Validate(),
	)
}

// validateBatchConcurrency bounds the loops from above; pubsub refuses a
// negative count, and 0 takes its default, as every zero field does.
func validateBatchConcurrency(n int) error {
	if n > maxBatchConcurrency {
		return fmt.Errorf("%s: %d, want at most %d", envBatchConcurrency, n, maxBatchConcurrency)
	}
	return nil
}
