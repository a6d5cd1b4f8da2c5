// Package app assembles the work-order service process: the database pool,
// the provider client, the API, the outbox relay with its dispatchers and the
// background workers, served by pkg/server (gRPC, REST gateway, health,
// graceful shutdown).
//
// Extending it: a new outbox event type is one entry in dispatchers (see
// assemble); a new background loop (inbox receiver, correlation relay,
// admin, ...) is one server.WithWorker option in workers.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/inbox"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/outboxpubsub"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgleader"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
	"github.com/lossless-dev/lossless/services/workorder/internal/api"
	"github.com/lossless-dev/lossless/services/workorder/internal/config"
	"github.com/lossless-dev/lossless/services/workorder/internal/correlation"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
	"github.com/lossless-dev/lossless/services/workorder/internal/orderstats"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// App is the assembled process.
type App struct {
	cfg    config.Config
	log    *slog.Logger
	tel    telemetry.Providers
	meter  metric.Meter
	db     *pgdb.Pools      // API and workers' pools, kept apart (pkg/pgdb)
	conn   *grpc.ClientConn // to the provider
	ps     *gpubsub.Client
	pub    *pubsub.Publisher // workorder-events
	srv    *server.Server
	loops  []server.Option // background loops; none in the api role
	closed bool
}

// New connects to the database (failing fast when it is unreachable), builds
// every component and binds the listeners. opts go to server.New (e.g. the
// /metrics handler). tel's nil providers disable that signal.
func New(ctx context.Context, cfg config.Config, logger *slog.Logger, tel telemetry.Providers, opts ...server.Option) (*App, error) {
	if logger == nil {
		return nil, errors.New("app: logger is nil")
	}
	tel = tel.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	db, err := pgdb.Open(ctx, cfg.Database, tel)
	if err != nil {
		return nil, fmt.Errorf("app: database pool: %w", err)
	}
	a := &App{cfg: cfg, log: logger, tel: tel, meter: tel.MeterProvider.Meter(config.ServiceName), db: db}
	if err := db.Workers.Ping(ctx); err != nil {
		a.Close()
		return nil, fmt.Errorf("app: database unreachable (DATABASE_URL): %w", err)
	}
	// grpc.NewClient does not dial: the provider may start after us, and the
	// relay retries hand-offs until it is reachable.
	// The hand-off call is a child of its outbox dispatch span, and carries
	// the trace context to the provider (otelgrpc client handler).
	// Reconnects at least every second, so a restarted provider is seen
	// as soon as the hand-off circuit probes it (handoff.ConnectParams).
	clientTLS, err := server.NewTLS(cfg.Server.TLS)
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("app: %s: %w", libenv.TLSEnvNames, err)
	}
	// Every call carries this service's ID token for the provider.
	providerToken, err := cfg.ProviderAuth.DialOption(context.WithoutCancel(ctx))
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("app: provider token (PROVIDER_AUDIENCE / AUTH_TOKEN_URL): %w", err)
	}
	// Keepalive pings replace a connection the provider stopped answering
	// on (a partition) within 15s; each hand-off ends at its own Deadline.
	if a.conn, err = grpc.NewClient(cfg.ProviderAddr, clientTLS.DialOption(),
		server.ClientKeepalive(),
		providerToken,
		grpc.WithConnectParams(handoff.ConnectParams),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithTracerProvider(tel.TracerProvider),
			otelgrpc.WithMeterProvider(tel.MeterProvider),
			otelgrpc.WithPropagators(tel.Propagator)))); err != nil {
		a.Close()
		return nil, fmt.Errorf("app: provider client (PROVIDER_ADDR): %w", err)
	}
	if a.ps, err = pubsub.NewClient(ctx, cfg.PubSub); err != nil {
		a.Close()
		return nil, fmt.Errorf("app: Pub/Sub client (PUBSUB_*): %w", err)
	}
	if err := a.assemble(ctx, opts); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// assemble builds the components. The API's handlers use a.db.API; every
// background loop, and the operator RPCs (which must work while the API is
// flooded), use a.db.Workers.
func (a *App) assemble(ctx context.Context, opts []server.Option) error {
	workerPool := a.db.Workers
	apiRepo, err := orders.NewRepository(a.db.API)
	if err != nil {
		return err
	}
	workerRepo, err := orders.NewRepository(workerPool)
	if err != nil {
		return err
	}
	// The store's pool serves only its cleanup; API requests record keys in
	// their own transaction.
	keys, err := idempotency.NewStore(workerPool, a.cfg.Idempotency, a.log.With("component", "idempotency"), a.meter)
	if err != nil {
		return err
	}
	svc, err := api.NewService(a.db.API, apiRepo, keys, a.cfg.OperatorSubjects, a.log.With("component", "api"), a.meter)
	if err != nil {
		return err
	}
	ops, err := admin.NewOps(workerPool, a.log.With("component", "admin"))
	if err != nil {
		return err
	}
	adminSvc, err := admin.NewService(ops, a.cfg.OperatorToken, a.log.With("component", "admin"))
	if err != nil {
		return err
	}
	// The InvoiceIssued consumer the operator replays run through,
	// configured as the live one.
	inv, err := invoicing.New(workerPool, a.cfg.Invoicing, a.log.With("component", "operator"), nil)
	if err != nil {
		return err
	}
	opsSvc, err := a.operatorService(workerPool, inv)
	if err != nil {
		return err
	}
	// An API-only replica builds no loop at all: their gauges would export
	// zeros that hide a stall (docs/adr/0013-api-and-worker-roles.md).
	if a.cfg.Server.Role.RunsWorkers() {
		if err := a.buildLoops(workerPool, workerRepo, keys); err != nil {
			return err
		}
	}
	// Callers of the public API are authenticated, the operator services
	// exempt (the operator token guards them); both before request
	// validation.
	callerAuth, err := a.cfg.Auth.Option(a.log,
		workorderv1.WorkOrderAdminService_ServiceDesc.ServiceName, opsv1.OperatorService_ServiceDesc.ServiceName)
	if err != nil {
		return err
	}
	srvOpts := append([]server.Option{server.WithTelemetry(a.tel), callerAuth,
		server.WithAuthInterceptors(adminSvc.AuthInterceptor(), opsSvc.AuthInterceptor())}, a.loops...)
	a.srv, err = server.New(a.cfg.Server, a.log, append(srvOpts, opts...)...)
	if err != nil {
		return err
	}
	// Readiness asks whether the database is reachable, on the workers' pool:
	// an exhausted API pool is back-pressure, not a reason to leave the load
	// balancer. Every role needs the database, so the check is the same.
	a.srv.AddReadinessCheck("database", workerPool.Ping)
	if !a.cfg.Server.Role.ServesAPI() {
		return nil
	}
	workorderv1.RegisterWorkOrderAdminServiceServer(a.srv.GRPC(), adminSvc)
	opsv1.RegisterOperatorServiceServer(a.srv.GRPC(), opsSvc)
	return api.Register(ctx, a.srv, svc)
}

// buildLoops builds the background loops into a.loops, all on the workers'
// pool. Loops whose duplication across replicas is wasteful or misleading
// (retention cleanups, the dead-letter peek) run under one pgleader lock;
// the rest are safe with N replicas (the ADR has the table).
func (a *App) buildLoops(workerPool *pgxpool.Pool, workerRepo *orders.Repository, keys *idempotency.Store) error {
	// The inbox: the receiver only stores (insert-then-ack); the relay
	// correlates stored completions to waiting orders; the monitor exports
	// the stall gauges (docs/adr/0007-inbox-vs-nack-retry-dlq.md). A
	// hand-off makes the completions that overtook it due (F5).
	store, err := inbox.NewStore(workerPool, a.meter)
	if err != nil {
		return err
	}
	handOff, err := handoff.NewDispatcher(providerv1.NewProviderServiceClient(a.conn), workerRepo, store, a.cfg.HandOff, a.log.With("component", "handoff"), a.meter)
	if err != nil {
		return err
	}

	// Completion events for billing go to Pub/Sub through the outbox too.
	if a.pub, err = pubsub.NewPublisher(a.ps, topology.TopicWorkOrderEvents, pubsub.DefaultPublisherConfig(), pubsub.WithPublisherMeter(a.meter)); err != nil {
		return err
	}

	// One dispatcher per outbox event type; an event of an unknown type goes
	// to FAILED, never silently dropped.
	// Each dispatch is a span linked to the request that wrote the event.
	dispatchers := outbox.TraceDispatchers(a.tel.TracerProvider, map[string]outbox.Dispatcher{
		handoff.EventType:                   handOff,
		correlation.EventCompletionRecorded: outboxpubsub.New(a.pub),
	})
	// The hand-off waits on the provider (hundreds of milliseconds, a
	// deadline when it does not answer): slow mode, so no hand-off waits for
	// a slower one and no transaction is held across the call (ADR 0002,
	// revision 3). Pub/Sub publishes keep the lock claim.
	relay, err := outbox.NewRelay(workerPool, dispatchers, a.cfg.Outbox, a.log.With("component", "outbox-relay"), a.meter,
		outbox.WithSlowDispatch(handoff.EventType))
	if err != nil {
		return err
	}

	sub, err := pubsub.NewSubscriber(a.ps, topology.SubWorkOrderCompleted, a.cfg.Subscriber, a.log.With("component", "inbox-receiver"), a.meter,
		pubsub.WithTracerProvider(a.tel.TracerProvider), pubsub.WithOwnConnection(a.cfg.PubSub))
	if err != nil {
		return err
	}
	hops, err := orderhop.New(a.meter)
	if err != nil {
		return err
	}
	recv, err := receiver.New(store, sub, a.cfg.Receiver, a.log.With("component", "inbox-receiver"), receiver.WithHops(hops))
	if err != nil {
		return err
	}
	correlate, err := inbox.NewRelay(workerPool, correlation.NewHandler(correlation.WithHops(hops)), a.cfg.Inbox, a.log.With("component", "inbox-relay"), a.meter,
		inbox.WithTracerProvider(a.tel.TracerProvider))
	if err != nil {
		return err
	}
	monitor, err := inbox.NewMonitor(workerPool, inbox.MonitorConfig{Reasons: []string{
		correlation.ReasonNotWaiting, correlation.ReasonUnknownOrder, correlation.ReasonAmbiguous,
		correlation.ReasonOverCompletion, correlation.ReasonOrderCancelled,
	}}, a.log.With("component", "inbox-monitor"), a.meter)
	if err != nil {
		return err
	}
	// Back from billing: InvoiceIssued moves the order to INVOICED, once
	// (idempotent consumer, pkg/consumer); its markers expire in batches.
	invoiced, err := invoicing.New(workerPool, a.cfg.Invoicing, a.log.With("component", "invoicing"), a.meter)
	if err != nil {
		return err
	}
	billingSub, err := pubsub.NewSubscriber(a.ps, topology.SubBillingEvents, a.cfg.Subscriber, a.log.With("component", "invoicing"), a.meter,
		pubsub.WithTracerProvider(a.tel.TracerProvider), pubsub.WithOwnConnection(a.cfg.PubSub))
	if err != nil {
		return err
	}
	// Stall gauges that need a query, each refreshed on its own interval.
	deadLetters, err := pubsub.NewDeadLetterMonitor(a.ps, pubsub.DeadLetterMonitorConfig{
		Subscriptions: []string{topology.SubWorkOrderCompletedDeadLetter, topology.SubBillingEventsDeadLetter},
	}, a.log.With("component", "dead-letter-monitor"), a.meter)
	if err != nil {
		return err
	}
	orderGauges, err := orderstats.New(workerPool, orderstats.Config{}, a.log.With("component", "order-stats"), a.meter)
	if err != nil {
		return err
	}
	markers, err := consumer.NewCleaner(workerPool, consumer.CleanerConfig{}, a.log.With("component", "dedup-cleaner"))
	if err != nil {
		return err
	}
	singletons, err := pgleader.New(workerPool, pgleader.Config{Name: SingletonLock}, a.log.With("component", "singletons"), a.meter)
	if err != nil {
		return err
	}

	// Background loops: started with the listeners, cancelled and awaited on
	// shutdown (in-flight work finishes or is released).
	a.loops = []server.Option{
		server.WithWorker("outbox-relay", relay.Run),
		server.WithWorker("inbox-receiver", recv.Run),
		server.WithWorker("inbox-relay", correlate.Run),
		server.WithWorker("inbox-monitor", monitor.Run),
		server.WithWorker("invoicing", func(ctx context.Context) error { return billingSub.RunBatch(ctx, invoiced.HandleBatch) }),
		server.WithWorker("order-stats", orderGauges.Run),
		server.WithWorker("singletons", func(ctx context.Context) error {
			return singletons.Run(ctx,
				pgleader.Task{Name: "idempotency-cleanup", Run: keys.RunCleanup},
				pgleader.Task{Name: "dedup-cleaner", Run: markers.Run},
				pgleader.Task{Name: "dead-letter-monitor", Run: deadLetters.Run})
		}),
	}
	return nil
}

// SingletonLock names the advisory lock under which one work-order replica
// runs the retention cleanups and the dead-letter monitor.
const SingletonLock = "workorder-singletons"

// Run serves until ctx is cancelled (SIGTERM), then shuts down gracefully and
// releases the database and provider connections. It returns nil after a
// clean shutdown.
func (a *App) Run(ctx context.Context) error {
	defer a.Close()
	return a.srv.Run(ctx)
}

// GRPCAddr and HTTPAddr are the bound listener addresses (tests use ":0").
func (a *App) GRPCAddr() string { return a.srv.GRPCAddr() }

// HTTPAddr is the bound HTTP address.
func (a *App) HTTPAddr() string { return a.srv.HTTPAddr() }

// Close releases the connections; Run calls it. Safe to call twice.
func (a *App) Close() {
	if a.closed {
		return
	}
	a.closed = true
	if a.conn != nil {
		_ = a.conn.Close()
	}
	if a.pub != nil {
		a.pub.Stop()
	}
	if a.ps != nil {
		_ = a.ps.Close()
	}
	a.db.Close()
}
