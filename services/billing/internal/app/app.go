// Package app assembles the billing service process: the database pool, the
// idempotent consumer of workorder-events (intake), the leased invoice worker
// (issuer on pkg/leasequeue), the InvoiceIssued outbox relay to
// billing-events, the processed-events cleanup and the read API, served by
// pkg/server (gRPC :9092, REST :8082, health, graceful shutdown).
package app

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/outboxpubsub"
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

// App is the assembled process (internal/serviceapp).
type App = serviceapp.App

// New assembles billing on the skeleton (serviceapp.New): connects to the
// database (failing fast when unreachable) and to Pub/Sub, builds every
// component and binds the listeners. opts go to server.New (e.g. the
// /metrics handler). tel's nil providers disable that signal.
func New(ctx context.Context, cfg config.Config, logger *slog.Logger, tel telemetry.Providers, opts ...server.Option) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return serviceapp.New(ctx, cfg.Common, serviceapp.Spec{
		Name:   config.ServiceName,
		Policy: api.Policy(),
		Operator: func(_ context.Context, p *serviceapp.Parts) ([]serviceapp.Surface, error) {
			return operatorSurfaces(p, cfg)
		},
		Loops: func(_ context.Context, p *serviceapp.Parts) ([]server.Option, error) { return loops(p, cfg) },
		API: func(ctx context.Context, p *serviceapp.Parts, srv *server.Server) error {
			svc, err := api.NewService(p.DB.API, p.Log.With("component", "api"))
			if err != nil {
				return err
			}
			return api.Register(ctx, srv, svc)
		},
	}, logger, tel, opts...)
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

// operatorSurfaces is billing's operator hook: the one operator API
// (pkg/operator OperatorService: the outbox, the intake's parked messages
// and dead letters, the invoice jobs and the operator_audit log) on the
// workers' pool, so that it works while the API is flooded. Its queue handle
// and intake take no meter (the gauges and counters are the worker's); the
// intake is configured as the live consumer's, so a replay consumes as it
// would.
func operatorSurfaces(p *serviceapp.Parts, cfg config.Config) ([]serviceapp.Surface, error) {
	logger := p.Log.With("component", "operator")
	queue, err := leasequeue.New(p.DB.Workers, cfg.Queue, logger, nil)
	if err != nil {
		return nil, err
	}
	in, err := intake.New(p.DB.Workers, queue, intake.Config{JobMaxAttempts: cfg.JobMaxAttempts, MaxPayloadBytes: cfg.IntakeMaxPayloadBytes},
		logger, nil)
	if err != nil {
		return nil, err
	}
	deps, err := admin.OperatorDeps(p.DB.Workers, queue, in, p.PubSub, logger)
	if err != nil {
		return nil, err
	}
	deps.Token = cfg.OperatorToken
	deps.Guard = p.OperatorGuard
	opsSvc, err := operator.NewService(deps)
	if err != nil {
		return nil, err
	}
	return []serviceapp.Surface{
		{Desc: &opsv1.OperatorService_ServiceDesc, Impl: opsSvc, Auth: opsSvc.AuthInterceptor()},
	}, nil
}

// loops builds the background loops on the workers' pool. The
// processed-events cleanup and the dead-letter peek run under one pgleader
// lock; the rest are safe with N replicas (the ADR has the table).
func loops(p *serviceapp.Parts, cfg config.Config) ([]server.Option, error) {
	publisher, err := pubsub.NewPublisher(p.PubSub, topology.TopicBillingEvents, pubsub.DefaultPublisherConfig(), pubsub.WithPublisherMeter(p.Meter))
	if err != nil {
		return nil, err
	}
	p.OnClose(publisher.Stop)
	// Background loops on the workers' pool, the read API on its own.
	c, err := Build(p.DB.Workers, publisher, cfg, p.Log, p.Tel)
	if err != nil {
		return nil, err
	}
	sub, err := pubsub.NewSubscriber(p.PubSub, topology.SubWorkOrderEvents, cfg.Subscriber, p.Log.With("component", "subscriber"), p.Meter,
		pubsub.WithTracerProvider(p.Tel.TracerProvider), pubsub.WithOwnConnection(cfg.PubSub))
	if err != nil {
		return nil, err
	}
	deadLetters, err := pubsub.NewDeadLetterMonitor(p.PubSub, pubsub.DeadLetterMonitorConfig{
		Subscriptions: []string{topology.SubWorkOrderEventsDeadLetter},
	}, p.Log.With("component", "dead-letter-monitor"), p.Meter)
	if err != nil {
		return nil, err
	}
	singletons, err := pgleader.New(p.DB.Workers, pgleader.Config{Name: SingletonLock}, p.Log.With("component", "singletons"), p.Meter)
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
