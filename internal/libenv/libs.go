package libenv

import (
	"context"
	"errors"
	"fmt"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// The libraries in pkg/ take their configuration as values; the functions
// below are where the services read those values from the environment, with
// the variable names the deployments set.

// Postgres reads DATABASE_URL (required) and the DATABASE_* settings of
// pgdb.Config from r; unset variables take def's values, and def's zero
// fields the package defaults (a service passes its own pool sizes in def).
// Check r.Err() and Validate afterwards.
func Postgres(r *envconfig.Reader, def pgdb.Config) pgdb.Config {
	def = def.WithDefaults()
	return pgdb.Config{
		URL:               r.Required("DATABASE_URL"),
		StatementTimeout:  r.Duration("DATABASE_STATEMENT_TIMEOUT", def.StatementTimeout),
		LockTimeout:       r.Duration("DATABASE_LOCK_TIMEOUT", def.LockTimeout),
		ConnectTimeout:    r.Duration("DATABASE_CONNECT_TIMEOUT", def.ConnectTimeout),
		TCPUserTimeout:    r.Duration("DATABASE_TCP_USER_TIMEOUT", def.TCPUserTimeout),
		KeepAliveIdle:     r.Duration("DATABASE_TCP_KEEPALIVE_IDLE", def.KeepAliveIdle),
		KeepAliveInterval: r.Duration("DATABASE_TCP_KEEPALIVE_INTERVAL", def.KeepAliveInterval),
		KeepAliveCount:    r.Int("DATABASE_TCP_KEEPALIVE_COUNT", def.KeepAliveCount),
		APIMaxConns:       r.Int("DATABASE_API_MAX_CONNS", def.APIMaxConns),
		WorkerMaxConns:    r.Int("DATABASE_WORKER_MAX_CONNS", def.WorkerMaxConns),
		PlanCacheMode:     r.String("DATABASE_PLAN_CACHE_MODE", def.PlanCacheMode),
	}
}

// Server reads the listeners and limits with the names every service
// shares (each process has its own environment): GRPC_ADDR, HTTP_ADDR,
// ADMIN_GRPC_ADDR and ADMIN_HTTP_ADDR (defaults def, the service's own
// ports), SHUTDOWN_TIMEOUT, HTTP_MAX_BODY_BYTES, HTTP_READ_HEADER_TIMEOUT,
// HTTP_READ_TIMEOUT, HTTP_WRITE_TIMEOUT, HTTP_IDLE_TIMEOUT and
// REQUEST_TIMEOUT (defaults: the server.Default constants; 0 means the
// default), PPROF_ADDR (default "": no profiles; a loopback address),
// SERVICE_ROLE (default "all") and the TLS_* variables of TLS.
func Server(r *envconfig.Reader, def Listeners) server.Config {
	if _, ok := r.Lookup("PPROF_ENABLED"); ok {
		r.Record(errors.New("PPROF_ENABLED is gone: set PPROF_ADDR to a loopback address (e.g. 127.0.0.1:6060) to serve profiles on a listener of their own"))
	}
	return server.Config{
		GRPCAddr:          r.String("GRPC_ADDR", def.GRPC),
		HTTPAddr:          r.String("HTTP_ADDR", def.HTTP),
		AdminGRPCAddr:     r.String(EnvAdminGRPCAddr, def.AdminGRPC),
		AdminHTTPAddr:     r.String(EnvAdminHTTPAddr, def.AdminHTTP),
		ShutdownTimeout:   r.Duration("SHUTDOWN_TIMEOUT", server.DefaultShutdownTimeout),
		MaxBodyBytes:      int64(r.Int("HTTP_MAX_BODY_BYTES", server.DefaultMaxBodyBytes)),
		ReadHeaderTimeout: r.Duration("HTTP_READ_HEADER_TIMEOUT", server.DefaultReadHeaderTimeout),
		ReadTimeout:       r.Duration("HTTP_READ_TIMEOUT", server.DefaultReadTimeout),
		RequestTimeout:    r.Duration("REQUEST_TIMEOUT", server.DefaultRequestTimeout),
		WriteTimeout:      r.Duration("HTTP_WRITE_TIMEOUT", 0),
		IdleTimeout:       r.Duration("HTTP_IDLE_TIMEOUT", server.DefaultIdleTimeout),
		PprofAddr:         r.String("PPROF_ADDR", ""),
		Role:              server.Role(r.String("SERVICE_ROLE", string(server.RoleAll))),
		TLS:               TLS(r),
	}
}

// The admin listeners' variables.
const (
	EnvAdminGRPCAddr = "ADMIN_GRPC_ADDR"
	EnvAdminHTTPAddr = "ADMIN_HTTP_ADDR"
)

// Listeners are a service's default listen addresses.
type Listeners struct {
	GRPC, HTTP           string // the public API, health and readiness
	AdminGRPC, AdminHTTP string // the operator services, their gateway, /metrics
}

// ServerEnvNames lists the variables Server reads, for errors that name them.
const ServerEnvNames = "GRPC_ADDR / HTTP_ADDR / ADMIN_GRPC_ADDR / ADMIN_HTTP_ADDR / SHUTDOWN_TIMEOUT / HTTP_MAX_BODY_BYTES / HTTP_READ_HEADER_TIMEOUT / HTTP_READ_TIMEOUT / HTTP_WRITE_TIMEOUT / HTTP_IDLE_TIMEOUT / REQUEST_TIMEOUT / PPROF_ADDR / SERVICE_ROLE / " + TLSEnvNames

// Environment variables read by TLS.
const (
	EnvTLSCertFile   = "TLS_CERT_FILE"
	EnvTLSKeyFile    = "TLS_KEY_FILE"
	EnvTLSCAFile     = "TLS_CA_FILE"
	EnvTLSClientAuth = "TLS_CLIENT_AUTH"
	TLSEnvNames      = "TLS_CERT_FILE / TLS_KEY_FILE / TLS_CA_FILE / TLS_CLIENT_AUTH"
)

// TLS reads the process's TLS settings (server.TLSConfig): TLS_CERT_FILE and
// TLS_KEY_FILE (its certificate, served and presented to servers that ask),
// TLS_CA_FILE (the roots it trusts, for the servers it dials and its
// callers' certificates) and TLS_CLIENT_AUTH (none, verify-if-given or
// require; default require with a certificate and a CA). All unset:
// plaintext. A client alone (a CLI, the load generator) sets TLS_CA_FILE.
// Check the result with server.NewTLS, which reads the files.
func TLS(r *envconfig.Reader) server.TLSConfig {
	return server.TLSConfig{
		CertFile:   r.String(EnvTLSCertFile, ""),
		KeyFile:    r.String(EnvTLSKeyFile, ""),
		CAFile:     r.String(EnvTLSCAFile, ""),
		ClientAuth: server.ClientAuth(r.String(EnvTLSClientAuth, "")),
	}
}

// NewTLS is server.NewTLS(TLS(r)), its error naming the variables: the
// client side of the process's TLS (nil: plaintext).
func NewTLS(r *envconfig.Reader) (*server.TLS, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	t, err := server.NewTLS(TLS(r))
	if err != nil {
		return nil, envconfig.Check(TLSEnvNames, err)
	}
	return t, nil
}

// Outbox reads the relay settings from environment variables with the
// given prefix (e.g. "WORKORDER_OUTBOX_"): BATCH_SIZE, DISPATCH_CONCURRENCY,
// SLOW_DISPATCH_CONCURRENCY, BATCHES_IN_FLIGHT, POLL_INTERVAL,
// SWEEP_INTERVAL, LEASE_DURATION, BACKOFF_BASE, BACKOFF_MAX, MAX_ATTEMPTS,
// CIRCUIT_THRESHOLD, CIRCUIT_PROBE_INTERVAL, CIRCUIT_PROBE_INTERVAL_MAX,
// OUTAGE_PROBE_INTERVAL, RETENTION, CLEANUP_INTERVAL, CLEANUP_BATCH,
// STATS_INTERVAL, RELAY_ID. Unset variables keep the defaults.
func Outbox(r *envconfig.Reader, prefix string) outbox.Config {
	return outbox.Config{
		RelayID:                 r.String(prefix+"RELAY_ID", ""),
		BatchSize:               r.Int(prefix+"BATCH_SIZE", outbox.DefaultBatchSize),
		DispatchConcurrency:     r.Int(prefix+"DISPATCH_CONCURRENCY", outbox.DefaultDispatchConcurrency),
		SlowDispatchConcurrency: r.Int(prefix+"SLOW_DISPATCH_CONCURRENCY", outbox.DefaultSlowDispatchConcurrency),
		BatchesInFlight:         r.Int(prefix+"BATCHES_IN_FLIGHT", outbox.DefaultBatchesInFlight),
		PollInterval:            r.Duration(prefix+"POLL_INTERVAL", outbox.DefaultPollInterval),
		SweepInterval:           r.Duration(prefix+"SWEEP_INTERVAL", outbox.DefaultSweepInterval),
		LeaseDuration:           r.Duration(prefix+"LEASE_DURATION", outbox.DefaultLeaseDuration),
		BackoffBase:             r.Duration(prefix+"BACKOFF_BASE", outbox.DefaultBackoffBase),
		BackoffMax:              r.Duration(prefix+"BACKOFF_MAX", outbox.DefaultBackoffMax),
		MaxAttempts:             r.Int(prefix+"MAX_ATTEMPTS", outbox.DefaultMaxAttempts),
		CircuitThreshold:        r.Int(prefix+"CIRCUIT_THRESHOLD", outbox.DefaultCircuitThreshold),
		CircuitProbeInterval:    r.Duration(prefix+"CIRCUIT_PROBE_INTERVAL", outbox.DefaultCircuitProbeInterval),
		CircuitProbeIntervalMax: r.Duration(prefix+"CIRCUIT_PROBE_INTERVAL_MAX", outbox.DefaultCircuitProbeIntervalMax),
		OutageProbeInterval:     r.Duration(prefix+"OUTAGE_PROBE_INTERVAL", outbox.DefaultOutageProbeInterval),
		Retention:               r.Duration(prefix+"RETENTION", outbox.DefaultRetention),
		CleanupInterval:         r.Duration(prefix+"CLEANUP_INTERVAL", outbox.DefaultCleanupInterval),
		CleanupBatch:            r.Int(prefix+"CLEANUP_BATCH", outbox.DefaultCleanupBatch),
		StatsInterval:           r.Duration(prefix+"STATS_INTERVAL", outbox.DefaultStatsInterval),
	}
}

// Inbox reads the relay configuration with prefix (e.g.
// "WORKORDER_INBOX_"): BATCH_SIZE, POLL_INTERVAL, SWEEP_INTERVAL,
// MAX_ATTEMPTS, MAX_AGE, DEFER_BACKOFF_BASE/MAX, TECHNICAL_BACKOFF_BASE/MAX,
// HANDLER_TIMEOUT, OUTAGE_PROBE_INTERVAL. Unset variables keep the defaults.
func Inbox(r *envconfig.Reader, prefix string) inbox.Config {
	d := inbox.Config{}.WithDefaults()
	return inbox.Config{
		BatchSize:           r.Int(prefix+"BATCH_SIZE", d.BatchSize),
		PollInterval:        r.Duration(prefix+"POLL_INTERVAL", d.PollInterval),
		SweepInterval:       r.Duration(prefix+"SWEEP_INTERVAL", d.SweepInterval),
		MaxAttempts:         r.Int(prefix+"MAX_ATTEMPTS", d.MaxAttempts),
		MaxAge:              r.Duration(prefix+"MAX_AGE", d.MaxAge),
		DeferBackoff:        retry.Backoff{Base: r.Duration(prefix+"DEFER_BACKOFF_BASE", d.DeferBackoff.Base), Max: r.Duration(prefix+"DEFER_BACKOFF_MAX", d.DeferBackoff.Max)},
		TechnicalBackoff:    retry.Backoff{Base: r.Duration(prefix+"TECHNICAL_BACKOFF_BASE", d.TechnicalBackoff.Base), Max: r.Duration(prefix+"TECHNICAL_BACKOFF_MAX", d.TechnicalBackoff.Max)},
		HandlerTimeout:      r.Duration(prefix+"HANDLER_TIMEOUT", d.HandlerTimeout),
		OutageProbeInterval: r.Duration(prefix+"OUTAGE_PROBE_INTERVAL", d.OutageProbeInterval),
	}
}

// Environment variables read by PubSub.
const (
	EnvPubSubProjectID    = "PUBSUB_PROJECT_ID"
	EnvGoogleCloudProject = "GOOGLE_CLOUD_PROJECT" // fallback for the project id, the GCP convention
	EnvPubSubEmulatorHost = "PUBSUB_EMULATOR_HOST"
)

// PubSub reads the client config: the project from PUBSUB_PROJECT_ID, else
// GOOGLE_CLOUD_PROJECT, else pubsub.DefaultProjectID with
// PUBSUB_EMULATOR_HOST set (any id works on an emulator), else empty (then
// ResolvePubSubProject asks the metadata server). The library's own
// emulator hook reads PUBSUB_EMULATOR_HOST too, which is why this reads
// that same variable (see pubsub.NewClient).
func PubSub(r *envconfig.Reader) pubsub.ClientConfig {
	c := pubsub.ClientConfig{
		ProjectID:    r.String(EnvPubSubProjectID, r.String(EnvGoogleCloudProject, "")),
		EmulatorHost: r.String(EnvPubSubEmulatorHost, ""),
	}
	if c.ProjectID == "" && c.EmulatorHost != "" {
		c.ProjectID = pubsub.DefaultProjectID
	}
	return c
}

// ResolvePubSubProject returns cfg with its ProjectID set: kept when set,
// pubsub.DefaultProjectID on an emulator, else the project id of the
// GCE/GKE metadata server (bounded by MetadataTimeout), else an error naming
// PUBSUB_PROJECT_ID. It is not done in PubSub because it may need the
// network.
func ResolvePubSubProject(ctx context.Context, cfg pubsub.ClientConfig) (pubsub.ClientConfig, error) {
	switch {
	case cfg.ProjectID != "":
		return cfg, nil
	case cfg.EmulatorHost != "":
		cfg.ProjectID = pubsub.DefaultProjectID
		return cfg, nil
	}
	id, err := ProjectFromMetadata(ctx)
	if err != nil {
		return cfg, envconfig.Check(EnvPubSubProjectID, fmt.Errorf("not set, nor %s, and not found on the metadata server: %w", EnvGoogleCloudProject, err))
	}
	cfg.ProjectID = id
	return cfg, nil
}

// PubSubClient resolves cfg's project (ResolvePubSubProject) and connects
// (pubsub.NewClient), for the commands that need a client of their own.
func PubSubClient(ctx context.Context, cfg pubsub.ClientConfig) (*gpubsub.Client, error) {
	cfg, err := ResolvePubSubProject(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pubsub: %w", err)
	}
	return pubsub.NewClient(ctx, cfg)
}

// Telemetry reads the telemetry settings of service: ExportTraces when
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set,
// unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none;
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL
// (default grpc); LOG_LEVEL (info); LOG_FORMAT (json); GOOGLE_CLOUD_PROJECT;
// and the resource from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
//
// With traces exported, the variables the OTLP exporter and the trace SDK
// read from the process environment themselves are vetted here too: each
// bad one is recorded in r, naming it, so the start fails instead of
// exporting nothing quietly.
func Telemetry(r *envconfig.Reader, service string) telemetry.Config {
	endpoint := r.String("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", r.String("OTEL_EXPORTER_OTLP_ENDPOINT", ""))
	disabled := r.Bool("OTEL_SDK_DISABLED", false)
	exporter := r.String("OTEL_TRACES_EXPORTER", "otlp")
	c := telemetry.Config{
		ServiceName:  service,
		ExportTraces: endpoint != "" && !disabled && exporter != "none",
		OTLPProtocol: r.String("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", r.String("OTEL_EXPORTER_OTLP_PROTOCOL", telemetry.ProtocolGRPC)),
		LogLevel:     r.String("LOG_LEVEL", "info"),
		LogFormat:    r.String("LOG_FORMAT", telemetry.LogFormatJSON),
		ProjectID:    r.String(EnvGoogleCloudProject, ""),
		// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (service.instance.id,
		// deployment.environment, k8s.pod.name, ...), merged over the
		// service name, as the specification wants.
		ResourceOptions: []resource.Option{resource.WithFromEnv()},
	}
	if c.ExportTraces {
		if err := checkOTLPEnv(r.Lookup); err != nil {
			r.Record(fmt.Errorf("telemetry: %w", err))
		}
	}
	return c
}

// ResolveTelemetryProject returns cfg with its ProjectID set from the
// metadata server when LOG_FORMAT is gcp and nothing set one, and fails,
// naming GOOGLE_CLOUD_PROJECT, when the server does not answer.
func ResolveTelemetryProject(ctx context.Context, cfg telemetry.Config) (telemetry.Config, error) {
	if cfg.LogFormat != telemetry.LogFormatGCP || cfg.ProjectID != "" {
		return cfg, nil
	}
	id, err := ProjectFromMetadata(ctx)
	if err != nil {
		return cfg, fmt.Errorf("telemetry: LOG_FORMAT=gcp needs the project of the traces: set GOOGLE_CLOUD_PROJECT or run on GCE/GKE: %w", err)
	}
	cfg.ProjectID = id
	return cfg, nil
}
