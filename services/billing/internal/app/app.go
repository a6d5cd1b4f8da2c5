// Package app assembles the billing service process: the database pool, the
// idempotent consumer of workorder-events (intake), the leased invoice worker
// (issuer on pkg/leasequeue), the InvoiceIssued outbox relay to
// billing-events, the processed-events cleanup and the read API, served by
// pkg/server (gRPC :9092, REST :8082, health, graceful shutdown).
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/outboxpubsub"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgleader"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/billing/internal/admin"
	"github.com/lossless-dev/lossless/services/billing/internal/api"
	"github.com/lossless-dev/lossless/services/billing/internal/config"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
	"github.com/lossless-dev/lossless/services/billing/internal/issuer"
)

// App is the assembled process.
type App struct {
	cfg       config.Config
	log       *slog.Logger
	tel       telemetry.Providers
	db        *pgdb.Pools // API and workers' pools, kept apart (pkg/pgdb)
	ps        *gpubsub.Client
	publisher *pubsub.Publisher
	srv       *server.Server
	closed    bool
}

// New connects to the database (failing fast when unreachable) and to
// Pub/Sub, builds every component and binds the listeners. opts go to
// server.New (e.g. the /metrics handler). tel's nil providers disable that
// signal.
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
	a := &App{cfg: cfg, log: logger, tel: tel, db: db}
	if err := db.Workers.Ping(ctx); err != nil {
		a.Close()
		return nil, fmt.Errorf("app: database unreachable (DATABASE_URL): %w", err)
	}
	if a.ps, err = pubsub.NewClient(ctx, cfg.PubSub); err != nil {
		a.Close()
		return nil, fmt.Errorf("app: pubsub client (PUBSUB_*): %w", err)
	}
	if err := a.assemble(ctx, opts); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// Components are the parts of billing that run as background loops; tests
// build them on their own database and emulator.
type Components struct {
	Queue   *leasequeue.Queue
	Worker  *leasequeue.Worker
	Intake  *intake.Intake
	Issuer  *issuer.Issuer
	Relay   *outbox.Relay
	Cleaner *consumer.Cleaner
}

// Build assembles the components on pool, publishing InvoiceIssued with pub.
// tel's nil providers disable that signal.
func Build(pool *pgxpool.Pool, pub *pubsub.Publisher, cfg config.Config, logger *slog.Logger, tel telemetry.Providers) (*Components, error) {
	var c Components
	var err error
	tel = tel.WithDefaults()
	meter := tel.MeterProvider.Meter(config.ServiceName)
	if c.Queue, err = leasequeue.New(pool, cfg.Queue, logger.With("component", "invoice-jobs"), meter,
		leasequeue.WithTracerProvider(tel.TracerProvider), leasequeue.WithClock(cfg.Clock)); err != nil {
		return nil, err
	}
	if c.Issuer, err = issuer.New(cfg.Clock, logger.With("component", "issuer"), meter); err != nil {
		return nil, err
	}
	if c.Worker, err = leasequeue.NewWorker(c.Queue, c.Issuer.Handle, cfg.Worker); err != nil {
		return nil, err
	}
	if c.Intake, err = intake.New(pool, c.Queue, intake.Config{JobMaxAttempts: cfg.JobMaxAttempts, MaxPayloadBytes: cfg.IntakeMaxPayloadBytes},
		logger.With("component", "intake"), meter); err != nil {
		return nil, err
	}
	invoiceIssued := string((&eventsv1.InvoiceIssued{}).ProtoReflect().Descriptor().FullName())
	dispatchers := outbox.TraceDispatchers(tel.TracerProvider, map[string]outbox.Dispatcher{invoiceIssued: outboxpubsub.New(pub)})
	if c.Relay, err = outbox.NewRelay(pool, dispatchers, cfg.Outbox, logger.With("component", "outbox-relay"), meter); err != nil {
		return nil, err
	}
	if c.Cleaner, err = consumer.NewCleaner(pool, cfg.ProcessedEvents, logger.With("component", "processed-events-cleanup")); err != nil {
		return nil, err
	}
	return &c, nil
}

// SingletonLock names the advisory lock under which one billing replica runs
// the processed-events cleanup and the dead-letter monitor.
const SingletonLock = "billing-singletons"

func (a *App) assemble(ctx context.Context, opts []server.Option) error {
	svc, err := api.NewService(a.db.API, a.log.With("component", "api"))
	if err != nil {
		return err
	}
	opsSvc, err := a.operatorService()
	if err != nil {
		return err
	}
	// An API-only replica builds no loop at all: their gauges would export
	// zeros that hide a stall (docs/adr/0013-api-and-worker-roles.md).
	// Callers of the public API are authenticated, the operator services
	// exempt (the operator token guards them); both before request
	// validation.
	callerAuth, err := a.cfg.Auth.Option(a.log,
		opsv1.OperatorService_ServiceDesc.ServiceName)
	if err != nil {
		return err
	}
	srvOpts := []server.Option{server.WithTelemetry(a.tel), callerAuth,
		server.WithAuthInterceptors(opsSvc.AuthInterceptor())}
	if a.cfg.Server.Role.RunsWorkers() {
		loops, err := a.loops()
		if err != nil {
			return err
		}
		srvOpts = append(srvOpts, loops...)
	}
	if a.srv, err = server.New(a.cfg.Server, a.log, append(srvOpts, opts...)...); err != nil {
		return err
	}
	// Reachability, on the workers' pool: an exhausted API pool is
	// back-pressure, not a reason to leave the load balancer. Every role
	// needs the database, so the check is the same.
	a.srv.AddReadinessCheck("database", a.db.Workers.Ping)
	if !a.cfg.Server.Role.ServesAPI() {
		return nil
	}
	opsv1.RegisterOperatorServiceServer(a.srv.GRPC(), opsSvc)
	return api.Register(ctx, a.srv, svc)
}

// operatorService builds the one operator API (pkg/operator
// OperatorService: the outbox, the intake's parked messages and dead
// letters, the invoice jobs and the operator_audit log) on the workers'
// pool, so that it works while the API is flooded. Its queue handle and
// intake take no meter (the gauges and counters are the worker's); the
// intake is configured as the live consumer's, so a replay consumes as it
// would.
func (a *App) operatorService() (*operator.Service, error) {
	logger := a.log.With("component", "operator")
	queue, err := leasequeue.New(a.db.Workers, a.cfg.Queue, logger, nil)
	if err != nil {
		return nil, err
	}
	in, err := intake.New(a.db.Workers, queue, intake.Config{JobMaxAttempts: a.cfg.JobMaxAttempts, MaxPayloadBytes: a.cfg.IntakeMaxPayloadBytes},
		logger, nil)
	if err != nil {
		return nil, err
	}
	deps, err := admin.OperatorDeps(a.db.Workers, queue, in, a.ps, logger)
	if err != nil {
		return nil, err
	}
	deps.Token = a.cfg.OperatorToken
	return operator.NewService(deps)
}

// loops builds the background loops on the workers' pool. The
// processed-events cleanup and the dead-letter peek run under one pgleader
// lock; the rest are safe with N replicas (the ADR has the table).
func (a *App) loops() ([]server.Option, error) {
	var err error
	meter := a.tel.MeterProvider.Meter(config.ServiceName)
	if a.publisher, err = pubsub.NewPublisher(a.ps, topology.TopicBillingEvents, pubsub.DefaultPublisherConfig(), pubsub.WithPublisherMeter(meter)); err != nil {
		return nil, err
	}
	// Background loops on the workers' pool, the read API on its own.
	c, err := Build(a.db.Workers, a.publisher, a.cfg, a.log, a.tel)
	if err != nil {
		return nil, err
	}
	sub, err := pubsub.NewSubscriber(a.ps, topology.SubWorkOrderEvents, a.cfg.Subscriber, a.log.With("component", "subscriber"), meter,
		pubsub.WithTracerProvider(a.tel.TracerProvider), pubsub.WithOwnConnection(a.cfg.PubSub))
	if err != nil {
		return nil, err
	}
	deadLetters, err := pubsub.NewDeadLetterMonitor(a.ps, pubsub.DeadLetterMonitorConfig{
		Subscriptions: []string{topology.SubWorkOrderEventsDeadLetter},
	}, a.log.With("component", "dead-letter-monitor"), meter)
	if err != nil {
		return nil, err
	}
	singletons, err := pgleader.New(a.db.Workers, pgleader.Config{Name: SingletonLock}, a.log.With("component", "singletons"), meter)
	if err != nil {
		return nil, err
	}
	return []server.Option{
		// Batched intake: one commit per pulled batch (see intake.HandleBatch).
		server.WithWorker("intake", func(ctx context.Context) error { return sub.RunBatch(ctx, c.Intake.HandleBatch) }),
		server.WithWorker("invoice-worker", c.Worker.Run),
		server.WithWorker("outbox-relay", c.Relay.Run),
		server.WithWorker("invoice-jobs-stats", c.Queue.RunStats),
		server.WithWorker("singletons", func(ctx context.Context) error {
			return singletons.Run(ctx,
				pgleader.Task{Name: "processed-events-cleanup", Run: c.Cleaner.Run},
				pgleader.Task{Name: "dead-letter-monitor", Run: deadLetters.Run})
		}),
	}, nil
}

// Run serves until ctx is cancelled (SIGTERM), then shuts down gracefully
// and releases the connections. It returns nil after a clean shutdown.
func (a *App) Run(ctx context.Context) error {
	defer a.Close()
	return a.srv.Run(ctx)
}

// GRPCAddr is the bound gRPC address (tests use ":0").
func (a *App) GRPCAddr() string { return a.srv.GRPCAddr() }

// HTTPAddr is the bound HTTP address.
func (a *App) HTTPAddr() string { return a.srv.HTTPAddr() }

// Close releases the connections; Run calls it. Safe to call twice.
func (a *App) Close() {
	if a.closed {
		return
	}
	a.closed = true
	if a.publisher != nil {
		a.publisher.Stop()
	}
	if a.ps != nil {
		_ = a.ps.Close()
	}
	a.db.Close()
}

// GRPCServices is what the gRPC server mounts (empty in the worker role),
// for tests that check every mounted method.
func (a *App) GRPCServices() map[string]grpc.ServiceInfo {
	if a.srv.GRPC() == nil {
		return nil
	}
	return a.srv.GRPC().GetServiceInfo()
}
