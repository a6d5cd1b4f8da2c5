// Package serviceapp is the one way a service with a database and Pub/Sub
// assembles its process; internal/servicecmd is its command line. A
// service's configuration embeds Common (database, Pub/Sub, listeners,
// caller authentication, operator token, telemetry), and its app.New hands
// New a Spec of what is its own:
//
//   - Connect: connections of its own (the work-order service's provider
//     client), after the database and Pub/Sub;
//   - Operator: the operator hook, mounting its repair surfaces (one call
//     into the service's admin package) on the admin listener, in every
//     role;
//   - Loops: its background loops, built only where the role runs them;
//   - API: its public API, registered only where the role serves it.
//
// New opens what every service opens (the API and workers' pools, failing
// fast when the database is unreachable, and the Pub/Sub client), builds
// the server with the telemetry, caller authentication (the operator
// surfaces exempt, guarded by their own interceptors), authorization (the
// Spec's authz.Policy, docs/adr/0025-authorization.md), the loops and the
// database readiness check, and Close releases it all in reverse.
package serviceapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"

	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Spec is what a service adds to the skeleton.
type Spec struct {
	// Name is the service's name, its meter's name.
	Name string
	// Connect opens the service's own connections, registering their
	// release with Parts.OnClose. Optional.
	Connect func(ctx context.Context, p *Parts) error
	// Operator mounts the service's repair surfaces, built on the workers'
	// pool so that they work while the API is flooded. Optional.
	Operator func(ctx context.Context, p *Parts) ([]Surface, error)
	// Loops builds the background loops on the workers' pool; called only
	// when the role runs workers. An API-only replica builds no loop at
	// all: their gauges would export zeros that hide a stall
	// (docs/adr/0013-api-and-worker-roles.md).
	Loops func(ctx context.Context, p *Parts) ([]server.Option, error)
	// API builds the public API on the API's pool and registers it on srv;
	// called only when the role serves the API.
	API func(ctx context.Context, p *Parts, srv *server.Server) error
	// Policy is the public API's authorization rules, one per method
	// (pkg/authz). Health and reflection are Open and the operator
	// surfaces Operator without being listed; a registered method with no
	// rule fails the start.
	Policy authz.Policy
	// Clients are clients beyond AUTH_CLIENTS (the work-order service's
	// operators, reading every customer's orders). Optional.
	Clients authz.Clients
}

// Surface is one operator gRPC service: mounted on the admin listener only
// (server.Config.AdminGRPCAddr) in every role, exempt from caller
// authentication, guarded by Auth (the operator token).
type Surface struct {
	Desc *grpc.ServiceDesc
	Impl any
	Auth grpc.UnaryServerInterceptor
}

// Parts are what the skeleton opened, handed to the Spec's hooks.
type Parts struct {
	Log    *slog.Logger
	Tel    telemetry.Providers // no nil providers
	Meter  metric.Meter        // the service's, from Tel
	DB     *pgdb.Pools         // API and workers' pools, kept apart (pkg/pgdb)
	PubSub *gpubsub.Client
	Config Common
	// OperatorGuard are the options of the operator services' guards
	// (operator.NewGuard, operator.Deps.Guard): Config.Operators' identities
	// and the REST gateway's mark.
	OperatorGuard []operator.GuardOption

	gateway *operator.GatewayMark
	closers []func()
}

// OnClose registers f to run when the app closes, before the connections
// registered earlier (and the Pub/Sub client and the pools) are released.
func (p *Parts) OnClose(f func()) { p.closers = append(p.closers, f) }

// App is an assembled service process.
type App struct {
	parts  *Parts
	srv    *server.Server
	closed bool
}

// New connects to the database (failing fast when it is unreachable) and to
// Pub/Sub, runs spec's hooks and binds the listeners. cfg is validated by
// the caller (the service's config.Validate covers it). opts go to
// server.New (e.g. the /metrics handler). tel's nil providers disable that
// signal.
func New(ctx context.Context, cfg Common, spec Spec, logger *slog.Logger, tel telemetry.Providers, opts ...server.Option) (*App, error) {
	if logger == nil {
		return nil, errors.New("app: logger is nil")
	}
	tel = tel.WithDefaults()
	db, err := pgdb.Open(ctx, cfg.Database, tel)
	if err != nil {
		return nil, fmt.Errorf("app: database pool: %w", err)
	}
	a := &App{parts: &Parts{Log: logger, Tel: tel, Meter: tel.MeterProvider.Meter(spec.Name), DB: db, Config: cfg}}
	if a.parts.gateway, err = operator.NewGatewayMark(); err != nil {
		a.Close()
		return nil, err
	}
	if a.parts.OperatorGuard, err = cfg.Operators.GuardOptions(cfg.Auth, a.parts.gateway); err != nil {
		a.Close()
		return nil, err
	}
	if err := db.Workers.Ping(ctx); err != nil {
		a.Close()
		return nil, fmt.Errorf("app: database unreachable (DATABASE_URL): %w", err)
	}
	if a.parts.PubSub, err = pubsub.NewClient(ctx, cfg.PubSub); err != nil {
		a.Close()
		return nil, fmt.Errorf("app: Pub/Sub client (PUBSUB_*): %w", err)
	}
	if spec.Connect != nil {
		if err := spec.Connect(ctx, a.parts); err != nil {
			a.Close()
			return nil, err
		}
	}
	if err := a.assemble(ctx, spec, opts); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

func (a *App) assemble(ctx context.Context, spec Spec, opts []server.Option) error {
	p := a.parts
	var surfaces []Surface
	if spec.Operator != nil {
		var err error
		if surfaces, err = spec.Operator(ctx, p); err != nil {
			return err
		}
	}
	exempt := make([]string, 0, len(surfaces))
	guards := make([]grpc.UnaryServerInterceptor, 0, len(surfaces))
	for _, s := range surfaces {
		exempt = append(exempt, s.Desc.ServiceName)
		guards = append(guards, s.Auth)
	}
	// Callers of the public API are authenticated, the operator services
	// exempt (the operator token guards them); both before request
	// validation.
	callerAuth, err := p.Config.Auth.Option(p.Log, exempt...)
	if err != nil {
		return err
	}
	authorizer, policy, err := a.authorizer(spec, surfaces)
	if err != nil {
		return err
	}
	srvOpts := append([]server.Option{server.WithTelemetry(p.Tel), callerAuth, server.WithAuthInterceptors(guards...),
		server.WithGatewayOptions(p.gateway.ServeMuxOption())}, authorizer.ServerOptions()...)
	if p.Config.Server.Role.RunsWorkers() && spec.Loops != nil {
		loops, err := spec.Loops(ctx, p)
		if err != nil {
			return err
		}
		srvOpts = append(srvOpts, loops...)
	}
	if a.srv, err = server.New(p.Config.Server, p.Log, append(srvOpts, opts...)...); err != nil {
		return err
	}
	// Reachability, on the workers' pool: an exhausted API pool is
	// back-pressure, not a reason to leave the load balancer. Every role
	// needs the database, so the check is the same.
	a.srv.AddReadinessCheck("database", p.DB.Workers.Ping)
	// Operators repair through any replica, worker ones included.
	for _, s := range surfaces {
		a.srv.AdminGRPC().RegisterService(s.Desc, s.Impl)
	}
	if !p.Config.Server.Role.ServesAPI() {
		return nil
	}
	if spec.API != nil {
		if err := spec.API(ctx, p, a.srv); err != nil {
			return err
		}
	}
	if missing := policy.Missing(a.srv.GRPC().GetServiceInfo()); len(missing) > 0 {
		return fmt.Errorf("app: methods without an authorization rule (the service's authz.Policy): %v", missing)
	}
	return nil
}

// authorizer builds the authorization of every call (pkg/authz): the
// service's policy, the shared rules and the operator surfaces'.
func (a *App) authorizer(spec Spec, surfaces []Surface) (*authz.Authorizer, authz.Policy, error) {
	clients, err := a.parts.Config.Auth.AuthorizedClients()
	if err != nil {
		return nil, nil, err
	}
	for id, c := range spec.Clients {
		clients = clients.With(c, id)
	}
	policy := authz.Infrastructure().Merge(spec.Policy)
	for _, s := range surfaces {
		policy = policy.With(authz.Operator, s.Desc)
	}
	az, err := authz.New(policy, authz.Config{Clients: clients}, a.parts.Log.With("component", "authz"))
	return az, policy, err
}

// Run serves until ctx is cancelled (SIGTERM), then shuts down gracefully
// (the loops finish or release their work) and releases the connections.
// It returns nil after a clean shutdown.
func (a *App) Run(ctx context.Context) error {
	defer a.Close()
	return a.srv.Run(ctx)
}

// GRPCAddr is the bound gRPC address (tests use ":0"; "" in the worker
// role).
func (a *App) GRPCAddr() string { return a.srv.GRPCAddr() }

// HTTPAddr is the bound HTTP address.
func (a *App) HTTPAddr() string { return a.srv.HTTPAddr() }

// AdminGRPCAddr is the bound admin gRPC address (the operator services).
func (a *App) AdminGRPCAddr() string { return a.srv.AdminGRPCAddr() }

// AdminHTTPAddr is the bound admin HTTP address (/metrics).
func (a *App) AdminHTTPAddr() string { return a.srv.AdminHTTPAddr() }

// GRPCServices is what the public gRPC server mounts (not served in the
// worker role), for tests that check every mounted method.
func (a *App) GRPCServices() map[string]grpc.ServiceInfo {
	return a.srv.GRPC().GetServiceInfo()
}

// AdminGRPCServices is what the admin gRPC server mounts.
func (a *App) AdminGRPCServices() map[string]grpc.ServiceInfo {
	return a.srv.AdminGRPC().GetServiceInfo()
}

// Close releases what the hooks registered (last first), the Pub/Sub
// client and the pools; Run calls it. Safe to call twice.
func (a *App) Close() {
	if a.closed {
		return
	}
	a.closed = true
	p := a.parts
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
	if p.PubSub != nil {
		_ = p.PubSub.Close()
	}
	p.DB.Close()
}
