// Package app assembles the provider simulator process: configuration from
// the environment, the PostgreSQL store, the Pub/Sub publisher, the engine
// and the gRPC/REST server.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/api"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/faults"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/incarnation"
)

// ServiceName is the telemetry service name.
const ServiceName = "provider-sim"

// Environment variables read by ConfigFromEnv (besides those of the engine,
// faults, pubsub and telemetry packages).
const (
	EnvDatabaseURL    = "DATABASE_URL"
	EnvOperatorToken  = "PROVIDER_OPERATOR_TOKEN"
	EnvAllowedCallers = "PROVIDER_ALLOWED_CALLERS"
)

// Config of the whole process.
type Config struct {
	// DatabaseURL of the simulator's own database (migrations.ProviderSim).
	// Env DATABASE_URL. Required.
	DatabaseURL string
	// Server listeners and request bounds. Env GRPC_ADDR (default ":9091"),
	// HTTP_ADDR (default ":8081"), SHUTDOWN_TIMEOUT (default 20s) and the
	// bounds of libenv.Server; SERVICE_ROLE or serve --role (default
	// all; api: SubmitWorkOrder and the knobs, no engine; worker: the engine
	// with /healthz, /readyz and /metrics only).
	Server server.Config
	// PubSub endpoint. Env PUBSUB_PROJECT_ID (else GOOGLE_CLOUD_PROJECT, else
	// "lossless-local" on an emulator, else the GCE/GKE metadata server's
	// project, looked up at start), PUBSUB_EMULATOR_HOST.
	PubSub pubsub.ClientConfig
	// Publisher batching; defaults of pubsub.DefaultPublisherConfig.
	Publisher pubsub.PublisherConfig
	// Engine execution settings. Env PROVIDER_WORKERS, PROVIDER_EXEC_*, ...,
	// and INSTANCE_ID (default "": none): this process's name across
	// restarts ("provider-sim-1"), unique among live replicas. When set, a
	// restarted instance resumes the jobs its dead predecessor held at once
	// instead of after their lease (engine.Config.Instance), and the fault
	// generator's stream is that instance's own.
	Engine engine.Config
	// Faults in force at start. Env PROVIDER_FAULT_*. Changes through the
	// admin RPC are in memory only: a restart returns to these values. The
	// generator draws from the stream of (PROVIDER_FAULT_SEED, INSTANCE_ID,
	// incarnation), the incarnation being this start's number recorded in
	// the database: a restart draws new plans, and a run is reproducible as
	// a sequence of starts.
	Faults faults.Rates
	// Telemetry: LOG_LEVEL (default info), LOG_FORMAT (default json; text;
	// gcp: Cloud Logging's fields, the trace field in the Pub/Sub project),
	// and the OpenTelemetry variables (OTEL_EXPORTER_OTLP_ENDPOINT, default
	// "": traces not exported; OTEL_EXPORTER_OTLP_HEADERS, _CERTIFICATE,
	// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, ...). See
	// telemetry.Config and docs/production.md.
	Telemetry telemetry.Config
	// OperatorToken guards every ProviderAdminService method but GetFaults
	// (UpdateFaults, PUT /v1/faults; ListJobs and GetJob, GET
	// /v1/jobs[/{job_id}]; any method added later) and OperatorService's
	// ListOperatorAudit (the fault changes' audit, gRPC): callers send
	// "authorization: Bearer <token>". Env
	// PROVIDER_OPERATOR_TOKEN, default "": those endpoints refuse every call.
	// At least operator.MinTokenLength (32) characters. The hand-off
	// (SubmitWorkOrder) and reading the knobs stay open.
	OperatorToken string
	// Auth authenticates the callers of SubmitWorkOrder (ProviderService):
	// AUTH_ISSUER and AUTH_AUDIENCE (required), AUTH_JWKS_URL, AUTH_DISABLED;
	// see libenv.CallerAuth. ProviderAdminService is exempt: its operator
	// methods have the operator token, and reading the knobs stays open.
	Auth libenv.CallerAuth
	// AllowedCallers are the caller subjects that may submit work (env
	// PROVIDER_ALLOWED_CALLERS, comma-separated; required unless
	// AUTH_DISABLED): the work-order service's identity. Another
	// authenticated caller is refused with PERMISSION_DENIED. They are the
	// peers of api.Policy's Peer rule (pkg/authz).
	AllowedCallers []string
	// Operators may call the operator services with an ID token
	// (AUTH_OPERATORS, AUTH_CONSOLES; libenv.OperatorIdentities).
	Operators libenv.OperatorIdentities
}

// ConfigFromEnv reads every setting; the error names each bad variable.
func ConfigFromEnv(env *envconfig.Reader) (Config, error) {
	cfg := Config{
		DatabaseURL:    env.Required(EnvDatabaseURL),
		Server:         libenv.Server(env, libenv.Listeners{GRPC: ":9091", HTTP: ":8081", AdminGRPC: ":9191", AdminHTTP: ":8181"}),
		PubSub:         libenv.PubSub(env),
		Publisher:      pubsub.DefaultPublisherConfig(),
		Engine:         engine.ConfigFromEnv(env),
		Faults:         faults.FromEnv(env),
		Telemetry:      libenv.Telemetry(env, ServiceName),
		OperatorToken:  env.String(EnvOperatorToken, ""),
		Auth:           libenv.ReadCallerAuth(env),
		AllowedCallers: libenv.SplitSubjects(env.String(EnvAllowedCallers, "")),
		Operators:      libenv.ReadOperatorIdentities(env),
	}
	cfg.Telemetry.ProjectID = cfg.PubSub.ProjectID
	if err := env.Err(); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// Validate checks every part, naming the variables at fault.
func (c Config) Validate() error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, envconfig.Check(EnvDatabaseURL, errors.New("required but not set")))
	} else if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		errs = append(errs, envconfig.Check(EnvDatabaseURL, errors.New("not a valid PostgreSQL connection string")))
	}
	if err := c.Server.Validate(); err != nil {
		errs = append(errs, envconfig.Check(libenv.ServerEnvNames, err))
	}
	errs = append(errs, c.PubSub.Validate(), c.Publisher.Validate(), c.Engine.Validate(), c.Faults.Validate(),
		// No client API: AUTH_CLIENTS is not read here.
		operator.ValidateToken(EnvOperatorToken, c.OperatorToken), c.Auth.ValidateIdentity(), c.Operators.Validate(c.Auth))
	if !c.Auth.Disabled && len(c.AllowedCallers) == 0 {
		errs = append(errs, envconfig.Check(EnvAllowedCallers,
			errors.New("required: the subjects that may submit work (the work-order service's), or AUTH_DISABLED=true")))
	}
	return errors.Join(errs...)
}

// App is the assembled process.
type App struct {
	srv    *server.Server
	pool   *pgxpool.Pool
	pub    *pubsub.Publisher
	close  func()
	logger *slog.Logger
}

// New connects to PostgreSQL and Pub/Sub and binds the listeners. opts are
// passed to server.New (e.g. the /metrics handler). tel's nil providers
// disable that signal.
func New(ctx context.Context, cfg Config, logger *slog.Logger, tel telemetry.Providers, opts ...server.Option) (*App, error) {
	if logger == nil {
		return nil, errors.New("app: nil logger")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tel = tel.WithDefaults()
	meter := tel.MeterProvider.Meter(ServiceName)
	pool, err := pgdb.New(ctx, cfg.DatabaseURL, tel)
	if err != nil {
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	client, err := pubsub.NewClient(ctx, cfg.PubSub)
	if err != nil {
		pool.Close()
		return nil, err
	}
	pub, err := pubsub.NewPublisher(client, topology.TopicWorkOrderCompleted, cfg.Publisher, pubsub.WithPublisherMeter(meter))
	if err != nil {
		_ = client.Close()
		pool.Close()
		return nil, err
	}
	a := &App{pool: pool, pub: pub, logger: logger, close: func() {
		pub.Stop()
		_ = client.Close()
		pool.Close()
	}}
	stream := a.stream(ctx, cfg.Engine.Instance)
	if err := a.assemble(cfg, stream, tel, meter, opts); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

// stream records this start in the database and names the fault stream it
// draws from. Without the database the start still draws a fresh stream (a
// random negative incarnation), never the previous start's: the simulator
// comes up as it did before, only that start's draws are not reproducible.
func (a *App) stream(ctx context.Context, instance string) faults.Stream {
	n, err := incarnation.Next(ctx, a.pool, instance)
	if err != nil {
		n = -1 - rand.Int64N(math.MaxInt64)
		a.logger.WarnContext(ctx, "could not record this start: its fault draws are random, not reproducible from the seed",
			"instance", instance, "incarnation", n, "err", err)
	}
	return faults.Stream{Instance: instance, Incarnation: n}
}

func (a *App) assemble(cfg Config, stream faults.Stream, tel telemetry.Providers, meter metric.Meter, opts []server.Option) error {
	dice, err := faults.NewDice(cfg.Faults, stream)
	if err != nil {
		return err
	}
	eng, err := engine.New(a.pool, a.pub, dice, cfg.Engine, a.logger, meter, engine.WithTracerProvider(tel.TracerProvider))
	if err != nil {
		return err
	}
	provider, err := api.NewProvider(eng, dice, a.logger)
	if err != nil {
		return err
	}
	admin, err := api.NewAdmin(a.pool, dice, a.logger)
	if err != nil {
		return err
	}
	audit, err := api.NewAuditLog(a.pool, cfg.OperatorToken, EnvOperatorToken, a.logger.With("component", "operator"))
	if err != nil {
		return err
	}
	mark, err := operator.NewGatewayMark()
	if err != nil {
		return err
	}
	guardOpts, err := cfg.Operators.GuardOptions(cfg.Auth, mark)
	if err != nil {
		return err
	}
	guard, err := operator.NewGuard(cfg.OperatorToken, EnvOperatorToken, a.logger, guardOpts...)
	if err != nil {
		return err
	}
	auth := []grpc.UnaryServerInterceptor{guard.ServiceInterceptor(providerv1.ProviderAdminService_ServiceDesc.ServiceName, api.OpenAdminMethods()...),
		guard.ServiceInterceptor(opsv1.OperatorService_ServiceDesc.ServiceName)}
	callerAuth, err := cfg.Auth.Option(a.logger, providerv1.ProviderAdminService_ServiceDesc.ServiceName,
		opsv1.OperatorService_ServiceDesc.ServiceName)
	if err != nil {
		return err
	}
	// SubmitWorkOrder is the peers' (PROVIDER_ALLOWED_CALLERS; with
	// AUTH_DISABLED, the anonymous caller's): api.Policy.
	peers := cfg.AllowedCallers
	if cfg.Auth.Disabled {
		peers = []string{server.AnonymousCaller.Subject}
	}
	policy := authz.Infrastructure().Merge(api.Policy())
	az, err := authz.New(policy, authz.Config{Peers: peers, PeersVar: EnvAllowedCallers}, a.logger.With("component", "authz"))
	if err != nil {
		return err
	}
	srv, err := server.New(cfg.Server, a.logger, append(append(opts, server.WithWorker("engine", eng.Run), server.WithTelemetry(tel),
		callerAuth, server.WithAuthInterceptors(auth...), server.WithGatewayOptions(mark.ServeMuxOption())), az.ServerOptions()...)...)
	if err != nil {
		return err
	}
	// Every role needs the database: the API inserts jobs, the engine runs them.
	srv.AddReadinessCheck("database", a.pool.Ping)
	a.srv = srv
	// The engine (the only loop) is started by the server unless the role
	// is api; the API is served unless it is worker (docs/adr/0013).
	if err := a.registerAdmin(admin, audit); err != nil {
		return err
	}
	if cfg.Server.Role.ServesAPI() {
		if err := a.registerAPI(provider); err != nil {
			return err
		}
		if missing := policy.Missing(srv.GRPC().GetServiceInfo()); len(missing) > 0 {
			return fmt.Errorf("app: methods without an authorization rule (api.Policy): %v", missing)
		}
	}
	r := dice.Rates()
	a.logger.Info("provider-sim configured", "workers", cfg.Engine.Workers, "instance", stream.Instance,
		"incarnation", stream.Incarnation, "faults_seed", r.Seed,
		"duplicate", r.Duplicate, "early_completion", r.EarlyCompletion, "split_completion", r.SplitCompletion,
		"poison", r.Poison, "unknown_order", r.UnknownOrder, "publish_then_crash", r.PublishThenCrash,
		"extra_delay", r.ExtraDelay, "accept_latency_p50", r.AcceptLatencyP50, "accept_latency_p99", r.AcceptLatencyP99,
		"accept_timeout", r.AcceptTimeout)
	return nil
}

// registerAPI mounts the public API. The gateway calls our own gRPC
// listener, so REST requests pass through the same validation interceptor.
// Registration only builds handlers.
func (a *App) registerAPI(provider providerv1.ProviderServiceServer) error {
	providerv1.RegisterProviderServiceServer(a.srv.GRPC(), provider)
	return providerv1.RegisterProviderServiceHandler(context.Background(), a.srv.Gateway(), a.srv.GatewayConn())
}

// registerAdmin mounts the admin services on the admin listeners, in every
// role: the fault knobs and the job reads work through worker replicas too.
func (a *App) registerAdmin(admin providerv1.ProviderAdminServiceServer, audit opsv1.OperatorServiceServer) error {
	providerv1.RegisterProviderAdminServiceServer(a.srv.AdminGRPC(), admin)
	// gRPC only, as every service's OperatorService: the fault changes' audit.
	opsv1.RegisterOperatorServiceServer(a.srv.AdminGRPC(), audit)
	if a.srv.AdminGatewayConn() == nil {
		return nil
	}
	return providerv1.RegisterProviderAdminServiceHandler(context.Background(), a.srv.AdminGateway(), a.srv.AdminGatewayConn())
}

// GRPCAddr is the bound gRPC address ("" in the worker role).
func (a *App) GRPCAddr() string { return a.srv.GRPCAddr() }

// HTTPAddr is the bound HTTP address.
func (a *App) HTTPAddr() string { return a.srv.HTTPAddr() }

// AdminGRPCAddr is the bound admin gRPC address (ProviderAdminService,
// OperatorService).
func (a *App) AdminGRPCAddr() string { return a.srv.AdminGRPCAddr() }

// AdminHTTPAddr is the bound admin HTTP address (the admin REST gateway,
// /metrics).
func (a *App) AdminHTTPAddr() string { return a.srv.AdminHTTPAddr() }

// Run serves until ctx is cancelled, shuts down gracefully (the engine stops
// claiming and releases its in-flight jobs) and closes the connections.
func (a *App) Run(ctx context.Context) error {
	defer a.close()
	return a.srv.Run(ctx)
}

// GRPCServices is what the public gRPC server mounts (not served in the
// worker role), for tests that check every mounted method.
func (a *App) GRPCServices() map[string]grpc.ServiceInfo {
	return a.srv.GRPC().GetServiceInfo()
}

// AdminGRPCServices is what the admin gRPC server mounts.
func (a *App) AdminGRPCServices() map[string]grpc.ServiceInfo {
	return a.srv.AdminGRPC().GetServiceInfo()
}
