package engine_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/faults"
)

// TestMain takes the test server from the environment (internal/testkit/benchkit):
// make bench runs the benchmarks with fsync on.
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

// bundle is one test's world: its own database, its own Pub/Sub endpoint, a
// publisher of the real pubsub package, and an observer subscription.
type bundle struct {
	pool   *pgxpool.Pool
	emu    *pubsubtest.Emulator
	pub    *pubsub.Publisher
	dice   *faults.Dice
	obs    *observer
	outage *outage
	logger *slog.Logger
	rt     *pgtest.RoundTrips // with options.countRoundTrips
}

type options struct {
	rates   faults.Rates
	timeout time.Duration // publisher timeout; default the package's
	// countRoundTrips: the pool counts its round trips on bundle.rt.
	countRoundTrips bool
}

func setup(t *testing.T, o options) *bundle { return setupTB(t, o) }

// setupB is setup for benchmarks (no observer subscription: nothing reads it).
func setupB(b *testing.B) *bundle { return setupTB(b, options{}) }

func setupTB(t testing.TB, o options) *bundle {
	t.Helper()
	out := &outage{}
	emu := pubsubtest.New(t, declaredtest.Topology(t), pstest.ServerReactorOption{FuncName: "Publish", Reactor: out})
	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicWorkOrderCompleted, pubsub.PublisherConfig{Timeout: o.timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	if o.rates.Seed == 0 {
		o.rates.Seed = 42
	}
	dice, err := faults.NewDice(o.rates, faults.Stream{})
	if err != nil {
		t.Fatal(err)
	}
	var pool *pgxpool.Pool
	var rt *pgtest.RoundTrips
	if o.countRoundTrips {
		pool, rt = pgtest.NewCountingPool(t, migrations.ProviderSim()...)
	} else {
		pool = pgtest.NewPool(t, migrations.ProviderSim()...)
	}
	return &bundle{
		pool:   pool,
		rt:     rt,
		emu:    emu,
		pub:    pub,
		dice:   dice,
		obs:    newObserver(t, emu),
		outage: out,
		logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// testConfig keeps executions tiny and leases short.
func testConfig() engine.Config {
	return engine.Config{
		Workers:         4,
		PollInterval:    20 * time.Millisecond,
		Lease:           300 * time.Millisecond,
		ExecBase:        5 * time.Millisecond,
		ExecPerPosition: time.Microsecond,
		NoJitter:        true,
		Crash:           func() { panic("unexpected crash fault") },
	}
}

func (b *bundle) newEngine(t *testing.T, cfg engine.Config) *engine.Engine {
	t.Helper()
	e, err := engine.New(b.pool, b.pub, b.dice, cfg, b.logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// running is an engine whose Run loop is active until stop.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func start(t *testing.T, e *engine.Engine) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		if err := e.Run(ctx); err != nil {
			t.Errorf("engine run: %v", err)
		}
	}()
	t.Cleanup(r.stop)
	return r
}

// stop cancels Run and waits for it: the graceful shutdown.
func (r *running) stop() {
	r.cancel()
	<-r.done
}

func (b *bundle) submit(t *testing.T, e *engine.Engine, positions int32) engine.Acceptance {
	t.Helper()
	acc, created, err := e.Submit(context.Background(), engine.Order{
		WorkOrderID: uuid.New(), CustomerID: "c-1", Description: "paint", Positions: positions,
	})
	if err != nil || !created {
		t.Fatalf("submit: created=%v err=%v", created, err)
	}
	return acc
}

func (b *bundle) jobStatus(t *testing.T, jobID uuid.UUID) string {
	t.Helper()
	var s string
	if err := b.pool.QueryRow(context.Background(), `SELECT status FROM jobs WHERE job_id = $1`, jobID).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// outage makes the emulator refuse publishes while on (Pub/Sub unavailable).
type outage struct{ on atomic.Bool }

func (o *outage) React(any) (bool, any, error) {
	if o.on.Load() {
		return true, nil, status.Error(codes.Unavailable, "injected outage")
	}
	return false, nil, nil
}

// msg is one message seen by the observer.
type msg struct {
	EventID     string
	EventType   string
	OrderingKey string
	Data        []byte
	PublishTime time.Time
}

func (m msg) completed(t *testing.T) *eventsv1.WorkOrderCompleted {
	t.Helper()
	var ev eventsv1.WorkOrderCompleted
	if err := proto.Unmarshal(m.Data, &ev); err != nil {
		t.Fatalf("decode %s: %v", m.EventID, err)
	}
	return &ev
}

// observer reads the topic through its own subscription, as a consumer
// would: unary Pull + Acknowledge.
type observer struct {
	emu  *pubsubtest.Emulator
	name string
	mu   sync.Mutex
	seen []msg
}

func newObserver(t testing.TB, emu *pubsubtest.Emulator) *observer {
	t.Helper()
	name := pubsub.SubscriptionName(emu.ProjectID, "test-observer")
	_, err := emu.Client.SubscriptionAdminClient.CreateSubscription(context.Background(), &pubsubpb.Subscription{
		Name:                  name,
		Topic:                 pubsub.TopicName(emu.ProjectID, topology.TopicWorkOrderCompleted),
		AckDeadlineSeconds:    60,
		EnableMessageOrdering: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &observer{emu: emu, name: name}
}

// all pulls what is available and returns every message seen so far.
func (o *observer) all(t *testing.T) []msg {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		//nolint:staticcheck // ReturnImmediately is deprecated on GCP but lets the test poll without waiting.
		resp, err := o.emu.Client.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{
			Subscription: o.name, MaxMessages: 1000, ReturnImmediately: true,
		})
		if err != nil {
			t.Fatalf("pull: %v", err)
		}
		if len(resp.GetReceivedMessages()) == 0 {
			return append([]msg(nil), o.seen...)
		}
		var acks []string
		for _, rm := range resp.GetReceivedMessages() {
			m := rm.GetMessage()
			o.seen = append(o.seen, msg{
				EventID:     m.GetAttributes()[pubsub.AttrEventID],
				EventType:   m.GetAttributes()[pubsub.AttrEventType],
				OrderingKey: m.GetOrderingKey(),
				Data:        m.GetData(),
				PublishTime: m.GetPublishTime().AsTime(),
			})
			acks = append(acks, rm.GetAckId())
		}
		if err := o.emu.Client.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{
			Subscription: o.name, AckIds: acks,
		}); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
}

// of returns the messages of kind eventType with ordering key key.
func of(ms []msg, eventType, key string) []msg {
	var out []msg
	for _, m := range ms {
		if m.EventType == eventType && (key == "" || m.OrderingKey == key) {
			out = append(out, m)
		}
	}
	return out
}

// firstCopies keeps the first copy of each event id, in publish order:
// publishing is at-least-once (record, publish, mark), so under load an
// event can be published again before it is marked, with the same id.
func firstCopies(ms []msg) []msg {
	seen := map[string]bool{}
	var out []msg
	for _, m := range ms {
		if !seen[m.EventID] {
			seen[m.EventID] = true
			out = append(out, m)
		}
	}
	return out
}

var (
	typeCompleted = string(proto.MessageName((*eventsv1.WorkOrderCompleted)(nil)))
	typeStarted   = string(proto.MessageName((*eventsv1.WorkOrderExecutionStarted)(nil)))
)
