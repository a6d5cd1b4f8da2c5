package app_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/orderhop/orderhoptest"
	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/billing/internal/app"
	"github.com/lossless-dev/lossless/services/billing/internal/config"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
	"github.com/lossless-dev/lossless/services/billing/internal/reconcile"
)

// TestMain takes the test server from the environment (internal/testkit/benchkit):
// make bench runs the benchmarks with fsync on.
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

const lease = 30 * time.Second

// testBundle: billing's components on their own database and emulator.
type testBundle struct {
	pool   *pgxpool.Pool
	emu    *pubsubtest.Emulator
	pub    *pubsub.Publisher
	clock  *clock
	cfg    config.Config
	c      *app.Components
	logger *slog.Logger
	reader *sdkmetric.ManualReader
	meter  *sdkmetric.MeterProvider
}

func setup(t *testing.T) *testBundle { return setupB(t) }

func setupB(t testing.TB) *testBundle { return setupOn(t, newPool(t)) }

// setupOn is setupB on pool (e.g. a pgtest.NewCountingPool).
func setupOn(t testing.TB, pool *pgxpool.Pool) *testBundle {
	t.Helper()
	b := &testBundle{
		pool:   pool,
		emu:    pubsubtest.New(t, declaredtest.Topology(t)),
		clock:  &clock{t: time.Date(2026, 4, 1, 9, 0, 0, 0, time.UTC)},
		logger: slog.New(slog.NewJSONHandler(testLogOut(), nil)),
		reader: sdkmetric.NewManualReader(),
	}
	b.meter = sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.reader))
	var err error
	if b.pub, err = pubsub.NewPublisher(b.emu.Client, topology.TopicBillingEvents, pubsub.DefaultPublisherConfig()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.pub.Stop)
	b.cfg = config.Config{
		Common: serviceapp.Common{Auth: libenv.CallerAuth{Disabled: true}}, // caller authentication: tested apart
		Queue:  leasequeue.Config{Name: config.QueueName, LeaseDuration: lease},
		Clock:  b.clock.Now,
		Worker: leasequeue.WorkerConfig{
			Owner: "main", Workers: 4, PollInterval: 5 * time.Millisecond, RescueInterval: 5 * time.Millisecond,
			FullScanInterval: 5 * time.Millisecond, HeartbeatInterval: lease - time.Second,
		},
		JobMaxAttempts:  5,
		ProcessedEvents: consumer.CleanerConfig{},
		Outbox:          outbox.Config{PollInterval: 10 * time.Millisecond},
	}
	if b.c, err = app.Build(b.pool, b.pub, b.cfg, b.logger, telemetry.Providers{MeterProvider: b.meter}); err != nil {
		t.Fatal(err)
	}
	return b
}

func newWorker(b *testBundle, cfg leasequeue.WorkerConfig) (*leasequeue.Worker, error) {
	return leasequeue.NewWorker(b.c.Queue, b.c.Issuer.Handle, cfg)
}

// newPool gives the test its own database, with a pool as large as the
// service's (pool_max_conns=20) rather than pgxpool's default of 4.
func newPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	// As the runtime role, as deployed: the grants must suffice.
	_, dsn := pgtest.RuntimeRole(t, pgtest.NewDatabase(t, migrations.Billing()...), migrations.Billing()...)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// worker returns another invoice worker on the bundle's queue.
func (b *testBundle) worker(t *testing.T, owner string, h leasequeue.Handler) *leasequeue.Worker {
	t.Helper()
	cfg := b.cfg.Worker
	cfg.Owner = owner
	if h == nil {
		h = b.c.Issuer.Handle
	}
	w, err := leasequeue.NewWorker(b.c.Queue, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func start(t *testing.T, name string, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: %v", name, err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("%s did not stop within 10s", name)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func completion(orderID uuid.UUID) *eventsv1.WorkOrderCompletionRecorded {
	return &eventsv1.WorkOrderCompletionRecorded{
		EventId: uuid.NewString(), WorkOrderId: orderID.String(), CustomerId: "cust-7",
		Description: "install 3 panels", Positions: 3, CompletedItems: 3,
		UnitPrice:   &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 12_50},
		CompletedAt: timestamppb.New(time.Date(2026, 4, 1, 8, 0, 0, 0, time.UTC)),
	}
}

var msgSeq atomic.Int64

func received(t testing.TB, ev *eventsv1.WorkOrderCompletionRecorded) *pubsub.Received {
	data, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return &pubsub.Received{
		ID:         fmt.Sprint(msgSeq.Add(1)),
		Data:       data,
		Attributes: pubsub.EventAttributes(ev.GetEventId(), intake.EventType, 1, time.Now()),
	}
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *testBundle) counter(t *testing.T, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range s.DataPoints {
					total += dp.Value
				}
			}
		}
	}
	return total
}

// The whole billing path on the emulator: the completion event is delivered
// twice (F2/F4 duplicate publish), one job, one invoice, one InvoiceIssued
// published on billing-events with the invoice number.
func TestF4_DuplicateDeliveryOverPubSubOneInvoice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	orderID := uuid.New()
	ev := completion(orderID)
	in, err := pubsub.NewPublisher(b.emu.Client, topology.TopicWorkOrderEvents, pubsub.DefaultPublisherConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop()
	for range 2 {
		if _, err := in.Publish(ctx, pubsub.Message{EventID: ev.GetEventId(), OrderingKey: orderID.String(), Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := pubsub.NewSubscriber(b.emu.Client, topology.SubWorkOrderEvents, pubsub.DefaultSubscriberConfig(), b.logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	start(t, "intake", func(ctx context.Context) error { return sub.RunBatch(ctx, b.c.Intake.HandleBatch) })
	start(t, "worker", b.c.Worker.Run)
	start(t, "relay", b.c.Relay.Run)

	waitfor.Value(t, 10*time.Second, "both deliveries consumed", int64(2), func() int64 {
		return b.counter(t, "billing.intake.messages")
	})
	waitfor.Value(t, 10*time.Second, "invoice issued", 1, func() int {
		return b.count(t, `SELECT count(*) FROM invoices WHERE work_order_id = $1`, orderID)
	})
	var number string
	var total int64
	if err := b.pool.QueryRow(ctx, `SELECT number, total_minor FROM invoices`).Scan(&number, &total); err != nil {
		t.Fatal(err)
	}
	if total != 3*1250 || len(number) != len("INV-2026-000001") || number[:9] != "INV-2026-" {
		t.Fatalf("invoice %s total %d", number, total)
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs`); n != 1 {
		t.Fatalf("jobs: %d", n)
	}
	if n := b.count(t, `SELECT count(*) FROM processed_events`); n != 1 {
		t.Fatalf("markers: %d", n)
	}
	// Billing's two hops are observed once for the order, the duplicate
	// delivery not at all.
	hops := orderhoptest.Collect(t, b.reader)
	if hops[orderhop.BillingIntake].Count != 1 || hops[orderhop.InvoiceIssue].Count != 1 {
		t.Fatalf("hop histogram: %+v, want billing_intake and invoice_issue observed once", hops)
	}

	// InvoiceIssued reaches billing-events through the outbox relay.
	out, err := pubsub.NewSubscriber(b.emu.Client, topology.SubBillingEvents, pubsub.DefaultSubscriberConfig(), b.logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *eventsv1.InvoiceIssued, 4)
	start(t, "billing-events", func(ctx context.Context) error {
		return out.RunBatch(ctx, func(_ context.Context, ms []*pubsub.Received) []error {
			for _, m := range ms {
				var ii eventsv1.InvoiceIssued
				if err := proto.Unmarshal(m.Data, &ii); err != nil || m.Attributes[pubsub.AttrEventID] != ii.GetEventId() {
					t.Errorf("InvoiceIssued message: %v, attrs %v", err, m.Attributes)
				}
				got <- &ii
			}
			return make([]error, len(ms))
		})
	})
	select {
	case ii := <-got:
		if ii.GetInvoiceNumber() != number || ii.GetWorkOrderId() != orderID.String() || ii.GetTotal().GetMinorUnits() != total {
			t.Fatalf("InvoiceIssued %v", ii)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no InvoiceIssued on billing-events")
	}
	// Once recorded, the event has left the outbox for outbox_published:
	// one event, delivered on the first attempt, nothing left to deliver.
	waitfor.Value(t, 10*time.Second, "InvoiceIssued recorded as published", 1, func() int {
		return b.count(t, `SELECT count(*) FROM outbox_events WHERE status = 'PUBLISHED' AND attempts = 1
			AND published_at IS NOT NULL AND aggregate_id = $1`, orderID.String())
	})
	if n := b.count(t, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("undelivered outbox rows: %d, want 0", n)
	}
}

// F4, concurrently: the same event delivered 4 times at once, 20 rounds:
// one marker, one job per event.
func TestF4_ConcurrentDuplicatesOneJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for range 20 {
		ev := completion(uuid.New())
		var wg sync.WaitGroup
		for range 4 {
			m := received(t, ev)
			wg.Go(func() {
				if err := b.c.Intake.Handle(ctx, m); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE unique_key = $1`, ev.GetWorkOrderId()); n != 1 {
			t.Fatalf("jobs for the event: %d", n)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM processed_events`); n != 20 {
		t.Fatalf("markers: %d", n)
	}
	// A second, distinct event for an order already queued: recorded, no second job.
	var orderID string
	if err := b.pool.QueryRow(ctx, `SELECT unique_key FROM leasequeue_jobs LIMIT 1`).Scan(&orderID); err != nil {
		t.Fatal(err)
	}
	again := completion(uuid.MustParse(orderID))
	if err := b.c.Intake.Handle(ctx, received(t, again)); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs`); n != 20 {
		t.Fatalf("jobs: %d, want 20", n)
	}
}

// F9: unparseable or invalid messages are parked with their raw bytes and
// reason, and acked (nil), never retried forever.
func TestF9_PoisonMessagesAreParkedAndAcked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	garbage := &pubsub.Received{ID: "g1", Data: []byte{0xff, 0x01, 0x02},
		Attributes: pubsub.EventAttributes(uuid.NewString(), intake.EventType, 1, time.Now())}
	bad := completion(uuid.New())
	bad.UnitPrice.CurrencyCode = "euro"
	badMsg := received(t, bad)
	noType := &pubsub.Received{ID: "n1", Data: []byte("x"), Attributes: map[string]string{}}
	other := &pubsub.Received{ID: "o1", Data: []byte("x"), Attributes: map[string]string{pubsub.AttrEventType: "lossless.events.v1.Other"}}
	for _, m := range []*pubsub.Received{garbage, badMsg, noType, other, garbage} {
		if err := b.c.Intake.Handle(ctx, m); err != nil {
			t.Fatalf("message %s nacked: %v", m.ID, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM parked_messages`); n != 4 {
		t.Fatalf("parked: %d, want 4 (garbage once, invalid, missing type, unknown type)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM parked_messages WHERE message_id = 'g1' AND data = '\xff0102'::bytea
		AND reason LIKE 'unparseable payload%'`); n != 1 {
		t.Fatal("garbage not kept with raw bytes and reason")
	}
	if n := b.count(t, `SELECT count(*) FROM parked_messages WHERE event_id = $1 AND reason LIKE '%currency_code%'`, bad.GetEventId()); n != 1 {
		t.Fatal("invalid event not parked with a reason naming the field")
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs`); n != 0 {
		t.Fatalf("jobs: %d", n)
	}
}

// F12: a worker claims the invoice job and dies (kill -9: no release, no
// heartbeat). After its lease, another worker issues the one invoice.
func TestF12_WorkerDiesMidInvoice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev := completion(uuid.New())
	if err := b.c.Intake.Handle(ctx, received(t, ev)); err != nil {
		t.Fatal(err)
	}
	// The dying worker got as far as computing its invoice effects.
	dead, err := b.c.Queue.Claim(ctx, "killed", 10, 0)
	if err != nil || len(dead) != 1 {
		t.Fatalf("claim: %v %v", dead, err)
	}
	if _, err := b.c.Issuer.Handle(ctx, dead[0]); err != nil {
		t.Fatal(err)
	}
	start(t, "survivor", b.worker(t, "survivor", nil).Run)
	b.clock.Advance(lease + time.Millisecond)
	waitfor.Value(t, 10*time.Second, "invoice issued by the survivor", 1, func() int {
		return b.count(t, `SELECT count(*) FROM invoices i JOIN leasequeue_jobs j ON j.id = i.job_id
			WHERE i.work_order_id = $1 AND j.state = 'done' AND j.epoch = 2`, ev.GetWorkOrderId())
	})
	if n := b.count(t, `SELECT count(*) FROM outbox_events WHERE event_type = 'lossless.events.v1.InvoiceIssued'`); n != 1 {
		t.Fatalf("InvoiceIssued events: %d", n)
	}
}

// F13: worker A's lease expires mid-invoice, worker B takes the job over and
// issues the invoice; then A tries to commit: fenced off, zero effects,
// logged and counted.
func TestF13_StaleWorkerIssuesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev := completion(uuid.New())
	if err := b.c.Intake.Handle(ctx, received(t, ev)); err != nil {
		t.Fatal(err)
	}
	inA, releaseA := make(chan struct{}), make(chan struct{})
	cfgA := b.cfg.Worker
	cfgA.Owner, cfgA.Workers = "a", 1 // its one slot stays busy: A cannot rescue its own job
	wa, err := leasequeue.NewWorker(b.c.Queue, func(ctx context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		effects, err := b.c.Issuer.Handle(ctx, job)
		close(inA)
		<-releaseA // A stalls (GC pause, partition) after preparing its invoice
		return effects, err
	}, cfgA)
	if err != nil {
		t.Fatal(err)
	}
	stopA := start(t, "a", wa.Run)
	<-inA
	b.clock.Advance(lease + time.Millisecond)
	stopB := start(t, "b", b.worker(t, "b", nil).Run)
	waitfor.Value(t, 10*time.Second, "B issued the invoice", 1, func() int {
		return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done' AND epoch = 2 AND unique_key = $1`, ev.GetWorkOrderId())
	})
	close(releaseA)
	waitfor.Value(t, 10*time.Second, "A fenced off", int64(1), func() int64 { return b.counter(t, "leasequeue.lease.fenced") })
	stopA()
	stopB()
	if n := b.count(t, `SELECT count(*) FROM invoices`); n != 1 {
		t.Fatalf("invoices: %d", n)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox_events`); n != 1 {
		t.Fatalf("InvoiceIssued events: %d", n)
	}
	if got := b.counter(t, "billing.invoices.issued"); got != 1 {
		t.Fatalf("issued counter: %d", got)
	}
}

// Three workers, 1,000 orders, leases expiring at random moments: exactly
// 1,000 invoices and 1,000 InvoiceIssued events.
func TestThreeWorkersRandomLeaseExpiriesExactlyOneInvoiceEach(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const orders = 1000
	ms := make([]*pubsub.Received, orders)
	for i := range ms {
		ms[i] = received(t, completion(uuid.New()))
	}
	for _, err := range b.c.Intake.HandleBatch(ctx, ms) {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The chaos below expires every lease in flight about once per 40
	// handler calls, far more often than any real system: give the jobs
	// enough attempts that none is parked for it (parking is tested elsewhere).
	if _, err := b.pool.Exec(ctx, `UPDATE leasequeue_jobs SET max_attempts = 1000`); err != nil {
		t.Fatal(err)
	}
	chaos := func(ctx context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		if rand.IntN(40) == 0 {
			b.clock.Advance(lease + time.Millisecond) // every lease in flight expires
		}
		return b.c.Issuer.Handle(ctx, job)
	}
	for _, owner := range []string{"a", "b", "c"} {
		start(t, owner, b.worker(t, owner, chaos).Run)
	}
	t.Cleanup(func() {
		if t.Failed() {
			rows, _ := b.pool.Query(ctx, `SELECT id, state, attempts, epoch, coalesce(lease_owner, ''), due_at, coalesce(last_error, '') FROM leasequeue_jobs WHERE state <> 'done'`)
			for rows.Next() {
				vals, _ := rows.Values()
				t.Logf("unfinished job: %v (clock %v)", vals, b.clock.Now())
			}
			rows.Close()
		}
	})
	waitfor.Value(t, 60*time.Second, "all jobs done", orders, func() int {
		return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done'`)
	})
	if n := b.count(t, `SELECT count(*) FROM invoices`); n != orders {
		t.Fatalf("invoices: %d, want %d", n, orders)
	}
	if n := b.count(t, `SELECT count(DISTINCT aggregate_id) FROM outbox_events`); n != orders || b.count(t, `SELECT count(*) FROM outbox_events`) != orders {
		t.Fatalf("InvoiceIssued events: want exactly one per order")
	}
	if found, err := reconcile.Local(ctx, b.pool, config.QueueName, b.clock.Now(), time.Minute); err != nil || len(found) != 0 {
		t.Fatalf("reconciliation on a healthy system: %v %v", found, err)
	}
	t.Logf("fenced writes: %d, rescues: %d", b.counter(t, "leasequeue.lease.fenced"),
		b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE epoch > 1`))
}

// A job whose attempts are exhausted is parked, counted and shown by
// reconciliation; an operator retry without ticket or actor is refused; with
// them, it is audited and issues exactly one invoice through the normal path.
func TestParkedJobRetriedByOperatorIssuesOneInvoice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev := completion(uuid.New())
	if err := b.c.Intake.Handle(ctx, received(t, ev)); err != nil {
		t.Fatal(err)
	}
	var broken atomic.Bool
	broken.Store(true)
	w := b.worker(t, "w", func(ctx context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		if broken.Load() {
			return nil, errors.New("tax service unavailable")
		}
		return b.c.Issuer.Handle(ctx, job)
	})
	start(t, "w", w.Run)
	for attempt := 1; attempt <= b.cfg.JobMaxAttempts; attempt++ {
		waitfor.Condition(t, 10*time.Second, "attempt fails", func() bool {
			return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE attempts = $1 AND state <> 'running'`, attempt) == 1
		})
		b.clock.Advance(10 * time.Minute) // past any backoff
	}
	waitfor.Value(t, 10*time.Second, "job parked", 1, func() int {
		return b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'dead' AND last_error LIKE '%tax service%'`)
	})
	if got := b.counter(t, "leasequeue.jobs.dead"); got != 1 {
		t.Fatalf("dead counter %d", got)
	}
	found, err := reconcile.Local(ctx, b.pool, config.QueueName, b.clock.Now(), time.Minute)
	if err != nil || len(found) != 1 || found[0].Kind != reconcile.KindJobDead {
		t.Fatalf("reconciliation: %+v %v", found, err)
	}
	var id int64
	if err := b.pool.QueryRow(ctx, `SELECT id FROM leasequeue_jobs`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.Queue.Retry(ctx, []int64{id}, "", "ops@example"); !errors.Is(err, leasequeue.ErrAuditRequired) {
		t.Fatalf("retry without ticket: %v", err)
	}
	if _, err := b.c.Queue.Retry(ctx, []int64{id}, "INC-42", ""); !errors.Is(err, leasequeue.ErrAuditRequired) {
		t.Fatalf("retry without actor: %v", err)
	}
	broken.Store(false)
	if got, err := b.c.Queue.Retry(ctx, []int64{id}, "INC-42", "ops@example"); err != nil || len(got) != 1 {
		t.Fatalf("retry: %v %v", got, err)
	}
	waitfor.Value(t, 10*time.Second, "invoice issued after retry", 1, func() int {
		return b.count(t, `SELECT count(*) FROM invoices WHERE work_order_id = $1`, ev.GetWorkOrderId())
	})
	if n := b.count(t, `SELECT count(*) FROM leasequeue_job_audit WHERE job_id = $1 AND ticket = 'INC-42' AND actor = 'ops@example'`, id); n != 1 {
		t.Fatalf("audit rows: %d", n)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox_events`); n != 1 {
		t.Fatalf("InvoiceIssued events: %d", n)
	}
}

func testLogOut() io.Writer {
	if os.Getenv("BILLING_TEST_LOG") != "" {
		return os.Stderr
	}
	return io.Discard
}
