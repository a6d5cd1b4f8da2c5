package receiver_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/correlation"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// TestMain takes the test server from the environment (internal/testkit/benchkit):
// make bench runs the benchmarks with fsync on.
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

var quiet = slog.New(slog.DiscardHandler)

type bundle struct {
	pool  *pgxpool.Pool
	store *inbox.Store
	emu   *pubsubtest.Emulator
	pub   *pubsub.Publisher
}

func setup(t testing.TB, pool *pgxpool.Pool) bundle {
	t.Helper()
	if pool == nil {
		pool = pgtest.NewPool(t, migrations.WorkOrder()...)
	}
	store, err := inbox.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicWorkOrderCompleted, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	return bundle{pool: pool, store: store, emu: emu, pub: pub}
}

// receive runs the receiver's batch handler on the subscription, wrapped by
// wrap (nil: unchanged), until the test ends.
func (b bundle) receive(t testing.TB, wrap func(pubsub.BatchHandler) pubsub.BatchHandler) {
	t.Helper()
	sub, err := pubsub.NewSubscriber(b.emu.Client, topology.SubWorkOrderCompleted, pubsub.SubscriberConfig{
		PullBackoff: retry.Backoff{Base: time.Millisecond, Max: 10 * time.Millisecond}}, quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := receiver.Handle(b.store, decoder(t), quiet)
	if wrap != nil {
		h = wrap(h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.RunBatch(ctx, h) }()
	t.Cleanup(func() { cancel(); <-done })
}

func decoder(t testing.TB) *receiver.Decoder {
	t.Helper()
	d, err := receiver.NewDecoder(receiver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (b bundle) publish(t testing.TB, eventID string, order uuid.UUID, items int) string {
	t.Helper()
	id, err := b.pub.Publish(context.Background(), pubsub.Message{EventID: eventID, OrderingKey: order.String(),
		Event: &eventsv1.WorkOrderCompleted{EventId: eventID, WorkOrderId: order.String(), CompletedItems: int32(items)}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (b bundle) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// allAcked reports whether every message published so far was acked.
func (b bundle) allAcked() bool {
	for _, m := range b.emu.Server.Messages() {
		if m.Topic == "projects/"+b.emu.ProjectID+"/topics/"+topology.TopicWorkOrderCompleted && m.Acks == 0 {
			return false
		}
	}
	return true
}

func TestF4_SameMessageTwiceAlsoConcurrently_OneRow(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.receive(t, nil)
	order := uuid.New()
	for round := range 20 {
		id := fmt.Sprintf("ev-%d", round)
		var wg sync.WaitGroup
		for range 2 { // the producer publishes the same event twice, concurrently (F2 upstream)
			wg.Go(func() { b.publish(t, id, order, 1) })
		}
		wg.Wait()
		// Redelivery of the same copy, and a direct concurrent ingest of it.
		msg := decoder(t).Decode(&pubsub.Received{ID: "direct", Data: mustData(id, order), Attributes: attrs(id)})
		var wg2 sync.WaitGroup
		for range 2 {
			wg2.Go(func() {
				if _, err := b.store.Ingest(context.Background(), []inbox.Message{msg}); err != nil {
					t.Error(err)
				}
			})
		}
		wg2.Wait()
	}
	waitfor.Condition(t, 10*time.Second, "every copy acked", b.allAcked)
	if n := b.count(t, `SELECT count(*) FROM inbox`); n != 20 {
		t.Fatalf("rows = %d, want 20 (one per business event)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox_conflicts`); n != 0 {
		t.Fatalf("identical copies must not be conflicts, got %d", n)
	}
}

func mustData(eventID string, order uuid.UUID) []byte {
	d, err := proto.Marshal(&eventsv1.WorkOrderCompleted{EventId: eventID, WorkOrderId: order.String(), CompletedItems: 1})
	if err != nil {
		panic(err)
	}
	return d
}

func attrs(eventID string) map[string]string {
	return pubsub.EventAttributes(eventID, correlation.TypeCompleted, 1, time.Unix(0, 0))
}

func TestF9_PoisonIsStoredParkedAndAcked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.receive(t, nil)
	ctx := context.Background()
	order := uuid.New()
	cases := []struct {
		data  []byte
		attrs map[string]string
	}{
		{[]byte("not protobuf \xff\xff"), attrs("p-unparseable")},
		{mustData("p-version", order), pubsub.EventAttributes("p-version", correlation.TypeCompleted, 2, time.Now())},
		{mustData("p-type", order), pubsub.EventAttributes("p-type", "lossless.events.v1.Unknown", 1, time.Now())},
		{mustData("", order), map[string]string{"event_type": correlation.TypeCompleted, "schema_version": "1"}},
		{mustData("p-attr-mismatch", order), attrs("other-id")},
	}
	for _, c := range cases {
		if _, err := b.pub.PublishRaw(ctx, c.data, c.attrs, order.String()); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Condition(t, 10*time.Second, "poison acked", b.allAcked)
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE status = 'PARKED' AND park_reason = 'POISON' AND last_error <> '' AND length(payload) > 0`); n != len(cases) {
		t.Fatalf("parked poison = %d, want %d", n, len(cases))
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE event_id LIKE 'pubsub-message:%' AND attributes ? 'event_type'`); n != 1 {
		t.Fatalf("poison without an event id must be keyed by message id and keep its attributes: %d", n)
	}
}

// F10: the process dies after the insert committed and before the ack. The
// wrapper commits the insert, then drops the ack (as a crash would); Pub/Sub
// redelivers, the insert is a no-op, the ack goes out.
func TestF10_CrashBetweenInsertAndAck_RedeliveryIsANoOp(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var crashed atomic.Bool
	b.receive(t, func(h pubsub.BatchHandler) pubsub.BatchHandler {
		return func(ctx context.Context, ms []*pubsub.Received) []error {
			errs := h(ctx, ms)
			if crashed.CompareAndSwap(false, true) {
				for i := range errs {
					errs[i] = errors.New("crash: ack lost")
				}
			}
			return errs
		}
	})
	id := b.publish(t, "ev-1", uuid.New(), 1)
	waitfor.Condition(t, 10*time.Second, "acked after redelivery", b.allAcked)
	if m := b.emu.Server.Message(id); m.Deliveries < 2 {
		t.Fatalf("deliveries = %d, want a redelivery", m.Deliveries)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox`); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
}

// F15: the database stops mid-stream and comes back. The receiver nacks
// while it is down (messages are redelivered, none acked unsaved), the relay
// backs off, and afterwards every completion is applied exactly once.
func TestF15_DatabaseDownAndBack_NothingLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgtest.StartCluster(ctx, pgtest.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Remove)
	admin, err := pgxpool.New(ctx, cluster.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `CREATE DATABASE workorder`); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	dsn := cluster.DSN("workorder")
	if _, err := pgmigrate.ApplyDSN(ctx, dsn, migrations.WorkOrder()...); err != nil {
		t.Fatal(err)
	}
	cfg, _ := pgxpool.ParseConfig(dsn)
	// While the server is down a connect is refused at once; after the
	// restart, on a loaded machine, a 1 s connect timeout kept failing and
	// nacking (each nack a redelivery to wait for) long after the server was
	// back.
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := setup(t, pool)

	const n = 30
	orders := make([]uuid.UUID, n)
	for i := range orders {
		orders[i] = uuid.New()
		if _, err := pool.Exec(ctx, `INSERT INTO work_orders (id, customer_id, description, positions, currency_code, unit_price_minor, status)
			VALUES ($1, 'c', 'd', 1, 'EUR', 1, 'HANDED_OFF')`, orders[i]); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO waiting_points (work_order_id, cause) VALUES ($1, 'handoff')`, orders[i]); err != nil {
			t.Fatal(err)
		}
	}
	var nacked atomic.Int64
	b.receive(t, func(h pubsub.BatchHandler) pubsub.BatchHandler {
		return func(ctx context.Context, ms []*pubsub.Received) []error {
			errs := h(ctx, ms)
			for _, err := range errs {
				if err != nil {
					nacked.Add(1)
				}
			}
			return errs
		}
	})
	relay, err := inbox.NewRelay(pool, correlation.NewHandler(), inbox.Config{PollInterval: 5 * time.Millisecond,
		TechnicalBackoff: retry.Backoff{Base: 10 * time.Millisecond, Max: 200 * time.Millisecond}}, quiet, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = relay.Run(rctx) }()
	defer func() { cancel(); <-relayDone }()

	for i := range n / 2 {
		b.publish(t, fmt.Sprintf("c-%d", i), orders[i], 1)
	}
	if err := cluster.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for i := n / 2; i < n; i++ {
		b.publish(t, fmt.Sprintf("c-%d", i), orders[i], 1)
	}
	waitfor.Condition(t, 10*time.Second, "receiver nacks while the database is down", func() bool { return nacked.Load() > 0 })
	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 90*time.Second, "every completion applied", func() bool {
		var applied int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE status = 'APPLIED'`).Scan(&applied)
		return applied == n
	})
	waitfor.Condition(t, 10*time.Second, "every message acked", b.allAcked)
	if got := b.count(t, `SELECT count(*) FROM work_orders WHERE status = 'COMPLETED' AND completed_items = 1`); got != n {
		t.Fatalf("completed orders = %d, want %d", got, n)
	}
	if got := b.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'lossless.events.v1.WorkOrderCompletionRecorded'`); got != n {
		t.Fatalf("completion events = %d, want %d (one each)", got, n)
	}
}
