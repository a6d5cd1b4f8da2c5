// Package app assembles the work-order service process: the database pool,
// the provider client, the API, the outbox relay with its dispatchers and the
// background workers, served by pkg/server (gRPC, REST gateway, health,
// graceful shutdown).
//
// It is built on the skeleton every service shares (internal/serviceapp):
// this package holds only the work-order service's hooks. Extending it: a
// new outbox event type is one entry in dispatchers (see loops); a new
// background loop is one server.WithWorker option in loops.
package app

import (
	"context"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/outboxpubsub"

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

// App is the assembled process (internal/serviceapp).
type App = serviceapp.App

// New assembles the work-order service on the skeleton (serviceapp.New):
// connects to the database (failing fast when it is unreachable), builds
// every component and binds the listeners. opts go to server.New (e.g. the
// /metrics handler). tel's nil providers disable that signal.
func New(ctx context.Context, cfg config.Config, logger *slog.Logger, tel telemetry.Providers, opts ...server.Option) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &assembly{cfg: cfg}
	return serviceapp.New(ctx, cfg.Common, serviceapp.Spec{
		Name:     config.ServiceName,
		Connect:  a.connect,
		Operator: a.operator,
		Loops:    a.loops,
		API:      a.api,
		Policy:   api.Policy(),
		// The operators read and cancel every customer's orders
		// (docs/adr/0025-authorization.md).
		Clients: authz.Clients{}.With(authz.All(), cfg.OperatorSubjects...),
	}, logger, tel, opts...)
}

// assembly holds what the hooks share: the provider client and the
// idempotency store. The API's handlers use the API's pool; every
// background loop, and the operator RPCs (which must work while the API is
// flooded), use the workers'.
type assembly struct {
	cfg  config.Config
	conn *grpc.ClientConn // to the provider
	keys *idempotency.Store
}

func (a *assembly) connect(ctx context.Context, p *serviceapp.Parts) error {
	cfg := a.cfg
	// grpc.NewClient does not dial: the provider may start after us, and the
	// relay retries hand-offs until it is reachable.
	// The hand-off call is a child of its outbox dispatch span, and carries
	// the trace context to the provider (otelgrpc client handler).
	// Reconnects at least every second, so a restarted provider is seen
	// as soon as the hand-off circuit probes it (handoff.ConnectParams).
	clientTLS, err := server.NewTLS(cfg.Server.TLS)
	if err != nil {
		return fmt.Errorf("app: %s: %w", libenv.TLSEnvNames, err)
	}
	// Every call carries this service's ID token for the provider.
	providerToken, err := cfg.ProviderAuth.DialOption(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("app: provider token (PROVIDER_AUDIENCE / AUTH_TOKEN_URL): %w", err)
	}
	// Keepalive pings replace a connection the provider stopped answering
	// on (a partition) within 15s; each hand-off ends at its own Deadline.
	if a.conn, err = grpc.NewClient(cfg.ProviderAddr, clientTLS.DialOption(),
		server.ClientKeepalive(),
		providerToken,
		grpc.WithConnectParams(handoff.ConnectParams),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithTracerProvider(p.Tel.TracerProvider),
			otelgrpc.WithMeterProvider(p.Tel.MeterProvider),
			otelgrpc.WithPropagators(p.Tel.Propagator)))); err != nil {
		return fmt.Errorf("app: provider client (PROVIDER_ADDR): %w", err)
	}
	p.OnClose(func() { _ = a.conn.Close() })
	// The store's pool serves only its cleanup; API requests record keys in
	// their own transaction.
	a.keys, err = idempotency.NewStore(p.DB.Workers, cfg.Idempotency, p.Log.With("component", "idempotency"), p.Meter)
	return err
}

// operator is the work-order service's operator hook: its admin service (the recorded re-hand-off) and
// the one operator API (pkg/operator) over the workers' pool, behind the
// operator token.
func (a *assembly) operator(_ context.Context, p *serviceapp.Parts) ([]serviceapp.Surface, error) {
	ops, err := admin.NewOps(p.DB.Workers, p.Log.With("component", "admin"))
	if err != nil {
		return nil, err
	}
	adminSvc, err := admin.NewService(ops, a.cfg.OperatorToken, p.Log.With("component", "admin"), p.OperatorGuard...)
	if err != nil {
		return nil, err
	}
	// The InvoiceIssued consumer the operator replays run through,
	// configured as the live one.
	inv, err := invoicing.New(p.DB.Workers, a.cfg.Invoicing, p.Log.With("component", "operator"), nil)
	if err != nil {
		return nil, err
	}
	// The one operator API over the work-order database, as the CLI runs it.
	deps, err := admin.OperatorDeps(p.DB.Workers, inv, a.cfg.Receiver, p.PubSub, p.Log.With("component", "operator"))
	if err != nil {
		return nil, err
	}
	deps.Token = a.cfg.OperatorToken
	deps.Guard = p.OperatorGuard
	opsSvc, err := operator.NewService(deps)
	if err != nil {
		return nil, err
	}
	return []serviceapp.Surface{
		{Desc: &workorderv1.WorkOrderAdminService_ServiceDesc, Impl: adminSvc, Auth: adminSvc.AuthInterceptor()},
		{Desc: &opsv1.OperatorService_ServiceDesc, Impl: opsSvc, Auth: opsSvc.AuthInterceptor()},
	}, nil
}

func (a *assembly) api(ctx context.Context, p *serviceapp.Parts, srv *server.Server) error {
	apiRepo, err := orders.NewRepository(p.DB.API)
	if err != nil {
		return err
	}
	svc, err := api.NewService(p.DB.API, apiRepo, a.keys, a.cfg.OperatorSubjects, p.Log.With("component", "api"), p.Meter)
	if err != nil {
		return err
	}
	return api.Register(ctx, srv, svc)
}

// loops builds the background loops, all on the workers' pool. Loops whose duplication across replicas is wasteful or misleading
// (retention cleanups, the dead-letter peek) run under one pgleader lock;
// the rest are safe with N replicas (the ADR has the table).
func (a *assembly) loops(_ context.Context, p *serviceapp.Parts) ([]server.Option, error) {
	workerPool := p.DB.Workers
	workerRepo, err := orders.NewRepository(workerPool)
	if err != nil {
		return nil, err
	}
	// The inbox: the receiver only stores (insert-then-ack); the relay
	// correlates stored completions to waiting orders; the monitor exports
	// the stall gauges (docs/adr/0007-inbox-vs-nack-retry-dlq.md). A
	// hand-off makes the completions that overtook it due (F5).
	store, err := inbox.NewStore(workerPool, p.Meter)
	if err != nil {
		return nil, err
	}
	handOff, err := handoff.NewDispatcher(providerv1.NewProviderServiceClient(a.conn), workerRepo, store, a.cfg.HandOff, p.Log.With("component", "handoff"), p.Meter)
	if err != nil {
		return nil, err
	}

	// Completion events for billing go to Pub/Sub through the outbox too.
	pub, err := pubsub.NewPublisher(p.PubSub, topology.TopicWorkOrderEvents, pubsub.DefaultPublisherConfig(), pubsub.WithPublisherMeter(p.Meter))
	if err != nil {
		return nil, err
	}
	p.OnClose(pub.Stop)

	// One dispatcher per outbox event type; an event of an unknown type goes
	// to FAILED, never silently dropped.
	// Each dispatch is a span linked to the request that wrote the event.
	dispatchers := outbox.TraceDispatchers(p.Tel.TracerProvider, map[string]outbox.Dispatcher{
		handoff.EventType:                   handOff,
		correlation.EventCompletionRecorded: outboxpubsub.New(pub),
	})
	// The hand-off waits on the provider (hundreds of milliseconds, a
	// deadline when it does not answer): slow mode, so no hand-off waits for
	// a slower one and no transaction is held across the call (ADR 0002,
	// revision 3). Pub/Sub publishes keep the lock claim.
	relay, err := outbox.NewRelay(workerPool, dispatchers, a.cfg.Outbox, p.Log.With("component", "outbox-relay"), p.Meter,
		outbox.WithSlowDispatch(handoff.EventType))
	if err != nil {
		return nil, err
	}

	sub, err := pubsub.NewSubscriber(p.PubSub, topology.SubWorkOrderCompleted, a.cfg.Subscriber, p.Log.With("component", "inbox-receiver"), p.Meter,
		pubsub.WithTracerProvider(p.Tel.TracerProvider), pubsub.WithOwnConnection(a.cfg.PubSub))
	if err != nil {
		return nil, err
	}
	hops, err := orderhop.New(p.Meter)
	if err != nil {
		return nil, err
	}
	recv, err := receiver.New(store, sub, a.cfg.Receiver, p.Log.With("component", "inbox-receiver"), receiver.WithHops(hops))
	if err != nil {
		return nil, err
	}
	correlate, err := inbox.NewRelay(workerPool, correlation.NewHandler(correlation.WithHops(hops)), a.cfg.Inbox, p.Log.With("component", "inbox-relay"), p.Meter,
		inbox.WithTracerProvider(p.Tel.TracerProvider))
	if err != nil {
		return nil, err
	}
	monitor, err := inbox.NewMonitor(workerPool, inbox.MonitorConfig{Reasons: []string{
		correlation.ReasonNotWaiting, correlation.ReasonUnknownOrder, correlation.ReasonAmbiguous,
		correlation.ReasonOverCompletion, correlation.ReasonOrderCancelled,
	}}, p.Log.With("component", "inbox-monitor"), p.Meter)
	if err != nil {
		return nil, err
	}
	// Back from billing: InvoiceIssued moves the order to INVOICED, once
	// (idempotent consumer, pkg/consumer); its markers expire in batches.
	invoiced, err := invoicing.New(workerPool, a.cfg.Invoicing, p.Log.With("component", "invoicing"), p.Meter)
	if err != nil {
		return nil, err
	}
	billingSub, err := pubsub.NewSubscriber(p.PubSub, topology.SubBillingEvents, a.cfg.Subscriber, p.Log.With("component", "invoicing"), p.Meter,
		pubsub.WithTracerProvider(p.Tel.TracerProvider), pubsub.WithOwnConnection(a.cfg.PubSub))
	if err != nil {
		return nil, err
	}
	// Stall gauges that need a query, each refreshed on its own interval.
	deadLetters, err := pubsub.NewDeadLetterMonitor(p.PubSub, pubsub.DeadLetterMonitorConfig{
		Subscriptions: []string{topology.SubWorkOrderCompletedDeadLetter, topology.SubBillingEventsDeadLetter},
	}, p.Log.With("component", "dead-letter-monitor"), p.Meter)
	if err != nil {
		return nil, err
	}
	orderGauges, err := orderstats.New(workerPool, orderstats.Config{}, p.Log.With("component", "order-stats"), p.Meter)
	if err != nil {
		return nil, err
	}
	markers, err := consumer.NewCleaner(workerPool, consumer.CleanerConfig{}, p.Log.With("component", "dedup-cleaner"))
	if err != nil {
		return nil, err
	}
	singletons, err := pgleader.New(workerPool, pgleader.Config{Name: SingletonLock}, p.Log.With("component", "singletons"), p.Meter)
	if err != nil {
		return nil, err
	}

	// Background loops: started with the listeners, cancelled and awaited on
	// shutdown (in-flight work finishes or is released).
	return []server.Option{
		server.WithWorker("outbox-relay", relay.Run),
		server.WithWorker("inbox-receiver", recv.Run),
		server.WithWorker("inbox-relay", correlate.Run),
		server.WithWorker("inbox-monitor", monitor.Run),
		server.WithWorker("invoicing", func(ctx context.Context) error { return billingSub.RunBatch(ctx, invoiced.HandleBatch) }),
		server.WithWorker("order-stats", orderGauges.Run),
		server.WithWorker("singletons", func(ctx context.Context) error {
			return singletons.Run(ctx,
				pgleader.Task{Name: "idempotency-cleanup", Run: a.keys.RunCleanup},
				pgleader.Task{Name: "dedup-cleaner", Run: markers.Run},
				pgleader.Task{Name: "dead-letter-monitor", Run: deadLetters.Run})
		}),
	}, nil
}

// SingletonLock names the advisory lock under which one work-order replica
// runs the retention cleanups and the dead-letter monitor.
const SingletonLock = "workorder-singletons"
