package invoicing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
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
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/orderhop/orderhoptest"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

type testBundle struct {
	pool *pgxpool.Pool
	inv  *invoicing.Invoicing
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.NewPool(t, migrations.WorkOrder()...)
	inv, err := invoicing.New(pool, invoicing.Config{}, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, inv: inv}
}

// order inserts a work order in status with version 3.
func (b *testBundle) order(t *testing.T, status string) uuid.UUID {
	t.Helper()
	id := uuid.New()
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO work_orders
		(id, customer_id, description, positions, currency_code, unit_price_minor, status, completed_items, version)
		VALUES ($1, 'cust-1', 'paint', 3, 'EUR', 1250, $2, 3, 3)`, id, status); err != nil {
		t.Fatal(err)
	}
	return id
}

func issued(orderID uuid.UUID) *eventsv1.InvoiceIssued {
	return &eventsv1.InvoiceIssued{
		EventId: uuid.NewString(), InvoiceId: uuid.NewString(), InvoiceNumber: "INV-2026-000042",
		WorkOrderId: orderID.String(), Total: &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 3750},
		IssuedAt: timestamppb.Now(),
	}
}

var seq atomic.Int64

func message(t testing.TB, ev *eventsv1.InvoiceIssued) *pubsub.Received {
	data, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return &pubsub.Received{ID: fmt.Sprint(seq.Add(1)), Data: data,
		Attributes: pubsub.EventAttributes(ev.GetEventId(), invoicing.EventType, 1, time.Now())}
}

type state struct {
	status      string
	invoiceID   *uuid.UUID
	version     int64
	transitions int
}

func (b *testBundle) state(t *testing.T, id uuid.UUID) state {
	t.Helper()
	var s state
	if err := b.pool.QueryRow(context.Background(), `SELECT status, invoice_id, version,
		(SELECT count(*) FROM work_order_transitions WHERE work_order_id = $1 AND to_status = 'INVOICED' AND cause = 'billing:INV-2026-000042')
		FROM work_orders WHERE id = $1`, id).Scan(&s.status, &s.invoiceID, &s.version, &s.transitions); err != nil {
		t.Fatal(err)
	}
	return s
}

func (b *testBundle) wantInvoicedOnce(t *testing.T, id uuid.UUID, ev *eventsv1.InvoiceIssued) {
	t.Helper()
	s := b.state(t, id)
	if s.status != "INVOICED" || s.invoiceID == nil || s.invoiceID.String() != ev.GetInvoiceId() || s.version != 4 || s.transitions != 1 {
		t.Fatalf("order %s: %+v; want INVOICED with %s, version 4, one transition", id, s, ev.GetInvoiceId())
	}
}

// F4: duplicate InvoiceIssued, sequential and concurrent: the order is
// invoiced once, its version bumped once.
func TestF4_DuplicateInvoiceIssuedInvoicesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for range 20 {
		id := b.order(t, "COMPLETED")
		ev := issued(id)
		var wg sync.WaitGroup
		for range 4 {
			m := message(t, ev)
			wg.Go(func() {
				if err := b.inv.Handle(ctx, m); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if err := b.inv.Handle(ctx, message(t, ev)); err != nil {
			t.Fatal(err)
		}
		b.wantInvoicedOnce(t, id, ev)
		// The same invoice re-announced under a new event id changes nothing.
		again := proto.CloneOf(ev)
		again.EventId = uuid.NewString()
		if err := b.inv.Handle(ctx, message(t, again)); err != nil {
			t.Fatal(err)
		}
		b.wantInvoicedOnce(t, id, ev)
	}
	var parked int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM parked_messages`).Scan(&parked); err != nil || parked != 0 {
		t.Fatalf("parked: %d %v", parked, err)
	}
}

// A batch, one transaction with a savepoint per message (Config.Concurrency
// bounds only the per-message fallback), each order's event twice in the
// same batch and a message for an order that is not COMPLETED among them:
// every order is invoiced once, the stray one parked, the outcomes line up
// with their messages.
func TestBatchAppliedConcurrentlyInvoicesEachOrderOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, migrations.WorkOrder()...)
	inv, err := invoicing.New(pool, invoicing.Config{Concurrency: 8}, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{pool: pool, inv: inv}
	ctx := context.Background()

	var batch []*pubsub.Received
	evs := map[uuid.UUID]*eventsv1.InvoiceIssued{}
	for range 20 {
		id := b.order(t, "COMPLETED")
		ev := issued(id)
		evs[id] = ev
		batch = append(batch, message(t, ev), message(t, ev))
	}
	stray := b.order(t, "CREATED")
	batch = append(batch, message(t, issued(stray)))

	outs, errs := inv.Process(ctx, batch)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	count := map[string]int{}
	for _, o := range outs {
		count[o]++
	}
	if count[invoicing.OutcomeInvoiced] != 20 || count[invoicing.OutcomeDuplicate] != 20 || count[invoicing.OutcomeParked] != 1 {
		t.Fatalf("outcomes %v, want 20 invoiced, 20 duplicate, 1 parked", count)
	}
	if outs[len(outs)-1] != invoicing.OutcomeParked {
		t.Fatalf("the stray order's message: outcome %q, want parked", outs[len(outs)-1])
	}
	for id, ev := range evs {
		b.wantInvoicedOnce(t, id, ev)
	}
	if s := b.state(t, stray); s.status != "CREATED" {
		t.Fatalf("stray order: %+v, want CREATED", s)
	}
}

func TestConfigConcurrencyBounds(t *testing.T) {
	for _, c := range []struct {
		n  int
		ok bool
	}{{0, true}, {1, true}, {64, true}, {65, false}, {-1, false}} {
		err := invoicing.Config{Concurrency: c.n}.Validate()
		if (err == nil) != c.ok {
			t.Errorf("Concurrency %d: %v, want ok=%v", c.n, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "Concurrency") {
			t.Errorf("Concurrency %d: error %q does not name the field", c.n, err)
		}
	}
}

// Through a real Pub/Sub endpoint: the message delivered twice, invoiced once.
func TestF4_DuplicateOverPubSub(t *testing.T) {
	t.Parallel()
	b := setup(t)
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	ctx := context.Background()
	id := b.order(t, "COMPLETED")
	ev := issued(id)
	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicBillingEvents, pubsub.DefaultPublisherConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Stop()
	for range 2 {
		if _, err := pub.Publish(ctx, pubsub.Message{EventID: ev.GetEventId(), OrderingKey: id.String(), Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := pubsub.NewSubscriber(emu.Client, topology.SubBillingEvents, pubsub.DefaultSubscriberConfig(),
		slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.RunBatch(runCtx, b.inv.HandleBatch) }()
	waitfor.Value(t, 10*time.Second, "both deliveries applied", 2, func() int {
		var n int
		_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM processed_events`).Scan(&n)
		if n == 1 && emu.Server != nil {
			acked := 0
			for _, m := range emu.Server.Messages() {
				if m.Acks > 0 {
					acked++
				}
			}
			return acked
		}
		return 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b.wantInvoicedOnce(t, id, ev)
}

// An InvoiceIssued for an order that is not COMPLETED is parked (and acked);
// a replay needs a ticket and an actor and applies through the same path once
// the cause is fixed. A second, different invoice for an invoiced order is
// parked as an I3 violation.
func TestNotCompletedOrderIsParkedAndReplayedByOperator(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.order(t, "HANDED_OFF")
	ev := issued(id)
	if err := b.inv.Handle(ctx, message(t, ev)); err != nil {
		t.Fatalf("nacked: %v", err)
	}
	if s := b.state(t, id); s.status != "HANDED_OFF" || s.version != 3 {
		t.Fatalf("order changed: %+v", s)
	}
	var parkedID int64
	var reason string
	if err := b.pool.QueryRow(ctx, `SELECT id, reason FROM parked_messages WHERE subject = $1`, id.String()).Scan(&parkedID, &reason); err != nil {
		t.Fatal(err)
	}
	if reason != "order is HANDED_OFF, not COMPLETED" {
		t.Fatalf("reason %q", reason)
	}
	if _, err := b.inv.Replay(ctx, b.pool, parkedID, "", "bob"); !errors.Is(err, invoicing.ErrAuditRequired) {
		t.Fatalf("replay without ticket: %v", err)
	}
	if _, err := b.inv.Replay(ctx, b.pool, parkedID, "INC-7", "bob"); err == nil {
		t.Fatal("replay applied to an order still not COMPLETED")
	}
	if _, err := b.pool.Exec(ctx, `UPDATE work_orders SET status = 'COMPLETED' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if out, err := b.inv.Replay(ctx, b.pool, parkedID, "INC-7", "bob"); err != nil || out != invoicing.OutcomeInvoiced {
		t.Fatalf("replay: %v %v", out, err)
	}
	b.wantInvoicedOnce(t, id, ev)
	var by, ticket string
	if err := b.pool.QueryRow(ctx, `SELECT replayed_by, ticket FROM parked_messages WHERE id = $1`, parkedID).Scan(&by, &ticket); err != nil || by != "bob" || ticket != "INC-7" {
		t.Fatalf("audit: %q %q %v", by, ticket, err)
	}
	if _, err := b.inv.Replay(ctx, b.pool, parkedID, "INC-7", "bob"); err == nil {
		t.Fatal("replayed twice")
	}

	other := issued(id)
	if err := b.inv.Handle(ctx, message(t, other)); err != nil {
		t.Fatal(err)
	}
	b.wantInvoicedOnce(t, id, ev)
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM parked_messages WHERE event_id = $1 AND reason LIKE '%second invoice for one order (I3)%'`, other.GetEventId()).Scan(&n); err != nil || n != 1 {
		t.Fatalf("second invoice not parked: %d %v", n, err)
	}
}

func TestPoisonIsParkedWithRawBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	m := &pubsub.Received{ID: "p1", Data: []byte{0xff, 0xfe}, Attributes: map[string]string{pubsub.AttrEventType: invoicing.EventType}}
	for range 2 {
		if err := b.inv.Handle(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM parked_messages WHERE message_id = 'p1' AND data = '\xfffe'::bytea AND reason LIKE 'unparseable%'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("parked: %d %v", n, err)
	}
}

func (b *testBundle) parkedReason(t *testing.T, messageID string) (reason string, data []byte) {
	t.Helper()
	if err := b.pool.QueryRow(context.Background(), `SELECT reason, data FROM parked_messages WHERE message_id = $1`,
		messageID).Scan(&reason, &data); err != nil {
		t.Fatalf("message %s not parked: %v", messageID, err)
	}
	return reason, data
}

func wantAcked(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d nacked: %v", i, err)
		}
	}
}

func setupMetered(t *testing.T) (*testBundle, *sdkmetric.ManualReader) {
	t.Helper()
	pool := pgtest.NewPool(t, migrations.WorkOrder()...)
	reader := sdkmetric.NewManualReader()
	inv, err := invoicing.New(pool, invoicing.Config{}, slog.New(slog.NewJSONHandler(io.Discard, nil)),
		sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test"))
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, inv: inv}, reader
}

func outcomes(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "workorder.invoicing.messages" {
				for _, dp := range s.DataPoints {
					o, _ := dp.Attributes.Value("outcome")
					out[o.AsString()] += dp.Value
				}
			}
		}
	}
	return out
}

// A batch mixing good InvoiceIssued events with bytes the database would
// reject: the good orders are INVOICED, each bad message is parked with its
// raw bytes and the rule it broke, and every message is acked (a nack would
// redeliver it until it is dead-lettered).
func TestBadMessagesAreParkedAndTheirBatchMatesApply(t *testing.T) {
	t.Parallel()
	b, reader := setupMetered(t)
	ctx := context.Background()

	var good []*eventsv1.InvoiceIssued
	var goodIDs []uuid.UUID
	for range 3 {
		id := b.order(t, "COMPLETED")
		goodIDs = append(goodIDs, id)
		good = append(good, issued(id))
	}
	nulIDOrder := b.order(t, "COMPLETED")
	nulID := issued(nulIDOrder)
	nulID.EventId = "evt\x00" + uuid.NewString()
	nulIDMsg := message(t, nulID)

	longIDOrder := b.order(t, "COMPLETED")
	longID := issued(longIDOrder)
	longID.EventId = strings.Repeat("y", 201)
	longIDMsg := message(t, longID)

	nulAttr := message(t, issued(b.order(t, "COMPLETED")))
	nulAttr.Attributes[pubsub.AttrCorrelationID] = "req\x00-1"

	badUTF8Attr := message(t, issued(b.order(t, "COMPLETED")))
	badUTF8Attr.Attributes["x-\xff"] = "v"

	nulNumber := issued(b.order(t, "COMPLETED"))
	nulNumber.InvoiceNumber = "INV\x00"
	nulNumberMsg := message(t, nulNumber)

	oversize := message(t, issued(b.order(t, "COMPLETED")))
	oversize.Data = append(oversize.Data, make([]byte, 1<<20)...)

	batch := []*pubsub.Received{message(t, good[0]), nulIDMsg, longIDMsg, message(t, good[1]), nulAttr,
		badUTF8Attr, nulNumberMsg, oversize, message(t, good[2])}
	wantAcked(t, b.inv.HandleBatch(ctx, batch))

	for i, id := range goodIDs {
		b.wantInvoicedOnce(t, id, good[i])
	}
	if s := b.state(t, nulIDOrder); s.status != "COMPLETED" {
		t.Errorf("order of the parked message: %+v", s)
	}
	for _, c := range []struct {
		m      *pubsub.Received
		reason string
	}{
		{nulIDMsg, "event_id: contains a NUL byte"},
		{longIDMsg, "event_id: 201 characters, limit 200"},
		{nulAttr, `attribute "correlation_id": value contains a NUL byte`},
		{badUTF8Attr, `attribute "x-\xff": name is not valid UTF-8`},
		{nulNumberMsg, "invoice_number: contains a NUL byte"},
		{oversize, fmt.Sprintf("payload %d bytes exceeds the cap of %d bytes", len(oversize.Data), 1<<20)},
	} {
		reason, data := b.parkedReason(t, c.m.ID)
		if !strings.Contains(reason, c.reason) {
			t.Errorf("message %s parked with reason %q, want it to contain %q", c.m.ID, reason, c.reason)
		}
		if string(data) != string(c.m.Data) {
			t.Errorf("message %s: raw bytes not kept", c.m.ID)
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM parked_messages WHERE subject = $1`, longIDOrder.String()).Scan(&n); err != nil || n != 1 {
		t.Errorf("parked row of the long event id does not carry its order: %d %v", n, err)
	}
	if o := outcomes(t, reader); o["invoiced"] != 3 || o["parked"] != 6 {
		t.Errorf("outcomes %v, want 3 invoiced, 6 parked", o)
	}
	// The invoiced hop (invoice issued → INVOICED) is observed for each
	// invoiced order and for nothing parked.
	if h := orderhoptest.Collect(t, reader)[orderhop.Invoiced]; h.Count != 3 {
		t.Errorf("invoiced hop observed %d times, want 3", h.Count)
	}
}

// A data error the decoder does not foresee (a rule the test adds to the
// transitions table) parks the message naming the rule; the order stays
// COMPLETED and the others apply.
func TestDataErrorParksTheMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `ALTER TABLE work_order_transitions ADD CONSTRAINT test_rejects_cause CHECK (cause <> 'billing:INV-REJECTED')`); err != nil {
		t.Fatal(err)
	}
	rejectedOrder, goodOrder := b.order(t, "COMPLETED"), b.order(t, "COMPLETED")
	rejected, good := issued(rejectedOrder), issued(goodOrder)
	rejected.InvoiceNumber = "INV-REJECTED"
	rejectedMsg := message(t, rejected)
	wantAcked(t, b.inv.HandleBatch(ctx, []*pubsub.Received{rejectedMsg, message(t, good)}))
	b.wantInvoicedOnce(t, goodOrder, good)
	if s := b.state(t, rejectedOrder); s.status != "COMPLETED" || s.version != 3 {
		t.Errorf("rejected order changed: %+v", s)
	}
	reason, _ := b.parkedReason(t, rejectedMsg.ID)
	if !strings.Contains(reason, "test_rejects_cause") || !strings.Contains(reason, "23514") {
		t.Errorf("reason %q does not name the violated rule", reason)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM processed_events WHERE event_id = $1`, rejected.GetEventId()).Scan(&n); err != nil || n != 0 {
		t.Errorf("marker of the parked message committed: %d %v", n, err)
	}
}

// Infrastructure failures nack: a cancelled context or a closed pool.
func TestInfrastructureErrorNacks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ms := []*pubsub.Received{message(t, issued(b.order(t, "COMPLETED"))), message(t, issued(b.order(t, "COMPLETED")))}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i, err := range b.inv.HandleBatch(ctx, ms) {
		if err == nil {
			t.Errorf("message %d acked on a cancelled context", i)
		}
	}
	b.pool.Close()
	for i, err := range b.inv.HandleBatch(context.Background(), ms) {
		if err == nil {
			t.Errorf("message %d acked on a closed pool", i)
		}
	}
}

// An event type this consumer does not apply is parked and counted as
// unknown_type, never acked silently.
func TestUnknownEventTypeIsParkedAndCounted(t *testing.T) {
	t.Parallel()
	b, reader := setupMetered(t)
	ctx := context.Background()
	id := b.order(t, "COMPLETED")
	m := message(t, issued(id))
	m.Attributes[pubsub.AttrEventType] = "lossless.events.v1.InvoiceVoided"
	wantAcked(t, b.inv.HandleBatch(ctx, []*pubsub.Received{m}))
	reason, data := b.parkedReason(t, m.ID)
	want := `unknown event type "lossless.events.v1.InvoiceVoided" (this consumer reads lossless.events.v1.InvoiceIssued)`
	if reason != want {
		t.Errorf("reason %q, want %q", reason, want)
	}
	if string(data) != string(m.Data) {
		t.Error("raw bytes not kept")
	}
	if s := b.state(t, id); s.status != "COMPLETED" {
		t.Errorf("order changed: %+v", s)
	}
	if o := outcomes(t, reader); o["unknown_type"] != 1 || o["ignored"] != 0 {
		t.Errorf("outcomes %v, want 1 unknown_type", o)
	}
}

// Replay applies only rows this consumer parked: the table is shared by every
// plain consumer of the database, and a row of another subscription is not
// an InvoiceIssued this consumer refused.
func TestReplayRefusesAnotherSubscriptionsRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.order(t, "COMPLETED")
	m := message(t, issued(id))
	var parkedID int64
	if err := b.pool.QueryRow(ctx, `INSERT INTO parked_messages (subscription, message_id, attributes, data, reason)
		VALUES ('audit.billing-events', $1, $2, $3, 'parked elsewhere') RETURNING id`, m.ID, m.Attributes, m.Data).Scan(&parkedID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.inv.Replay(ctx, b.pool, parkedID, "INC-8", "bob"); err == nil {
		t.Fatal("replayed another subscription's parked message")
	}
	if s := b.state(t, id); s.status != "COMPLETED" || s.version != 3 {
		t.Errorf("order changed: %+v", s)
	}
	var open int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM parked_messages WHERE id = $1 AND replayed_at IS NULL`, parkedID).Scan(&open); err != nil || open != 1 {
		t.Errorf("row closed: %d %v", open, err)
	}
}
