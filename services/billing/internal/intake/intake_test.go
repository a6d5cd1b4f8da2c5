package intake_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
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
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

type testBundle struct {
	pool   *pgxpool.Pool
	in     *intake.Intake
	reader *sdkmetric.ManualReader
}

// setup builds the consumer with the zero Config: every default applies.
func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := pgtest.NewPool(t, migrations.Billing()...)
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
	reader := sdkmetric.NewManualReader()
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")
	queue, err := leasequeue.New(pool, leasequeue.Config{Name: "invoices"}, logger, meter)
	if err != nil {
		t.Fatal(err)
	}
	in, err := intake.New(pool, queue, intake.Config{}, logger, meter)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, in: in, reader: reader}
}

func completion() *eventsv1.WorkOrderCompletionRecorded {
	return &eventsv1.WorkOrderCompletionRecorded{
		EventId: uuid.NewString(), WorkOrderId: uuid.NewString(), CustomerId: "cust-7",
		Description: "install 3 panels", Positions: 3, CompletedItems: 3,
		UnitPrice:   &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 12_50},
		CompletedAt: timestamppb.New(time.Date(2026, 4, 1, 8, 0, 0, 0, time.UTC)),
	}
}

var msgSeq atomic.Int64

// message is ev as the work-order service publishes it: the attribute
// event_id equals the payload's.
func message(t testing.TB, ev *eventsv1.WorkOrderCompletionRecorded) *pubsub.Received {
	t.Helper()
	data, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return &pubsub.Received{ID: fmt.Sprint("m", msgSeq.Add(1)), Data: data,
		Attributes: pubsub.EventAttributes(ev.GetEventId(), intake.EventType, 1, time.Now())}
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// parked returns the reason of the parked row of message id, "" if none.
func (b *testBundle) parked(t *testing.T, messageID string) (reason string, data []byte) {
	t.Helper()
	err := b.pool.QueryRow(context.Background(),
		`SELECT reason, data FROM parked_messages WHERE message_id = $1`, messageID).Scan(&reason, &data)
	if err != nil {
		t.Fatalf("message %s not parked: %v", messageID, err)
	}
	return reason, data
}

func (b *testBundle) wantJob(t *testing.T, ev *eventsv1.WorkOrderCompletionRecorded) {
	t.Helper()
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE unique_key = $1`, ev.GetWorkOrderId()); n != 1 {
		t.Fatalf("order %s: %d invoice jobs, want 1", ev.GetWorkOrderId(), n)
	}
}

// outcomes sums billing.intake.messages by outcome.
func (b *testBundle) outcomes(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "billing.intake.messages" {
				for _, dp := range s.DataPoints {
					o, _ := dp.Attributes.Value("outcome")
					out[o.AsString()] += dp.Value
				}
			}
		}
	}
	return out
}

func wantAcked(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d nacked: %v", i, err)
		}
	}
}

// A batch mixing good completions with every kind of bytes the database
// would reject: the good ones become invoice jobs, each bad one is parked
// with its raw bytes and the rule it broke, and every message is acked. No
// bad message reaches the database as a value it rejects, so no batch is
// ever redelivered because of one.
func TestBadMessagesAreParkedAndTheirBatchMatesCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	good := []*eventsv1.WorkOrderCompletionRecorded{completion(), completion(), completion()}

	nulID := completion()
	nulID.EventId = "evt\x00" + uuid.NewString()
	nulIDMsg := message(t, nulID)

	longID := completion()
	longID.EventId = strings.Repeat("x", 250)
	longIDMsg := message(t, longID)

	nulAttr := message(t, completion())
	nulAttr.Attributes[pubsub.AttrCorrelationID] = "req\x00-1"

	badUTF8Attr := message(t, completion())
	badUTF8Attr.Attributes[pubsub.AttrCorrelationID] = "req\xff-1"

	nulDescription := completion()
	nulDescription.Description = "paint\x00"
	nulDescriptionMsg := message(t, nulDescription)

	oversize := message(t, completion())
	oversize.Data = append(oversize.Data, make([]byte, 1<<20)...)

	batch := []*pubsub.Received{message(t, good[0]), nulIDMsg, longIDMsg, message(t, good[1]), nulAttr,
		badUTF8Attr, nulDescriptionMsg, oversize, message(t, good[2])}
	wantAcked(t, b.in.HandleBatch(ctx, batch))

	for _, ev := range good {
		b.wantJob(t, ev)
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs`); n != len(good) {
		t.Fatalf("jobs: %d, want %d", n, len(good))
	}
	for _, c := range []struct {
		m      *pubsub.Received
		reason string
	}{
		{nulIDMsg, "event_id: contains a NUL byte"},
		{longIDMsg, "event_id: 250 characters, limit 200"},
		{nulAttr, `attribute "correlation_id": value contains a NUL byte`},
		{badUTF8Attr, `attribute "correlation_id": value is not valid UTF-8`},
		{nulDescriptionMsg, "description: contains a NUL byte"},
		{oversize, fmt.Sprintf("payload %d bytes exceeds the cap of %d bytes", len(oversize.Data), 1<<20)},
	} {
		reason, data := b.parked(t, c.m.ID)
		if !strings.Contains(reason, c.reason) {
			t.Errorf("message %s parked with reason %q, want it to contain %q", c.m.ID, reason, c.reason)
		}
		if string(data) != string(c.m.Data) {
			t.Errorf("message %s: raw bytes not kept (%d bytes stored, %d received)", c.m.ID, len(data), len(c.m.Data))
		}
	}
	// The unstorable attribute is kept escaped, and the reason says so.
	var attr, reason string
	if err := b.pool.QueryRow(ctx, `SELECT attributes->>'correlation_id', reason FROM parked_messages WHERE message_id = $1`,
		nulAttr.ID).Scan(&attr, &reason); err != nil {
		t.Fatal(err)
	}
	if attr != `req\x00-1` || !strings.Contains(reason, `stored escaped: attributes`) {
		t.Errorf("NUL attribute stored as %q, reason %q", attr, reason)
	}
	// A parked message leaves no dedup marker: once fixed and re-published
	// under its id, it applies.
	if n := b.count(t, `SELECT count(*) FROM processed_events`); n != len(good) {
		t.Errorf("markers: %d, want %d", n, len(good))
	}
	if o := b.outcomes(t); o["enqueued"] != 3 || o["parked"] != 6 {
		t.Errorf("outcomes %v, want 3 enqueued, 6 parked", o)
	}

	// Redelivered, the batch changes nothing and is acked again.
	wantAcked(t, b.in.HandleBatch(ctx, batch))
	if n := b.count(t, `SELECT count(*) FROM parked_messages`); n != 6 {
		t.Fatalf("parked after redelivery: %d, want 6", n)
	}
}

// A data error the decoder does not foresee (here: a rule the test adds to
// the leasequeue_jobs table) rolls back only the offending message's effects; it is
// parked naming the rule, its batch-mates commit, and all are acked.
func TestDataErrorIsIsolatedToItsMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rejected := completion()
	if _, err := b.pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE leasequeue_jobs ADD CONSTRAINT test_rejects_order CHECK (unique_key <> '%s')`,
		rejected.GetWorkOrderId())); err != nil {
		t.Fatal(err)
	}
	good := []*eventsv1.WorkOrderCompletionRecorded{completion(), completion()}
	rejectedMsg := message(t, rejected)
	wantAcked(t, b.in.HandleBatch(ctx, []*pubsub.Received{message(t, good[0]), rejectedMsg, message(t, good[1])}))
	for _, ev := range good {
		b.wantJob(t, ev)
	}
	reason, data := b.parked(t, rejectedMsg.ID)
	if !strings.Contains(reason, "test_rejects_order") || !strings.Contains(reason, "23514") {
		t.Errorf("reason %q does not name the violated rule", reason)
	}
	if string(data) != string(rejectedMsg.Data) {
		t.Error("raw bytes not kept")
	}
	// The row names its order, for the operator who looks for it.
	if n := b.count(t, `SELECT count(*) FROM parked_messages WHERE message_id = $1 AND subject = $2`,
		rejectedMsg.ID, rejected.GetWorkOrderId()); n != 1 {
		t.Error("parked row does not carry its work order as subject")
	}
	// Its marker was rolled back with its job: a replay can apply it.
	if n := b.count(t, `SELECT count(*) FROM processed_events WHERE event_id = $1`, rejected.GetEventId()); n != 0 {
		t.Errorf("marker of the parked message committed")
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs`); n != 2 {
		t.Errorf("jobs: %d, want 2", n)
	}
}

// An infrastructure failure is not the data's fault: the whole batch is
// nacked and nothing of it is committed.
func TestInfrastructureErrorNacksTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := b.in.HandleBatch(ctx, []*pubsub.Received{message(t, completion()), message(t, completion())})
	for i, err := range errs {
		if err == nil {
			t.Errorf("message %d acked on a cancelled context", i)
		}
	}
	b.pool.Close()
	errs = b.in.HandleBatch(context.Background(), []*pubsub.Received{message(t, completion())})
	if errs[0] == nil {
		t.Error("message acked on a closed pool")
	}
}

// An event type billing does not consume is never dropped silently: it is
// parked with a reason naming both types, and counted as unknown_type.
func TestUnknownEventTypeIsParkedAndCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	m := message(t, completion())
	m.Attributes[pubsub.AttrEventType] = "lossless.events.v1.WorkOrderArchived"
	good := completion()
	wantAcked(t, b.in.HandleBatch(ctx, []*pubsub.Received{m, message(t, good)}))
	b.wantJob(t, good)
	reason, data := b.parked(t, m.ID)
	want := `unknown event type "lossless.events.v1.WorkOrderArchived" (this consumer reads lossless.events.v1.WorkOrderCompletionRecorded)`
	if reason != want {
		t.Errorf("reason %q, want %q", reason, want)
	}
	if string(data) != string(m.Data) {
		t.Error("raw bytes not kept")
	}
	if n := b.count(t, `SELECT count(*) FROM parked_messages WHERE message_id = $1 AND event_type = 'lossless.events.v1.WorkOrderArchived'`, m.ID); n != 1 {
		t.Error("event type not recorded with the parked message")
	}
	if o := b.outcomes(t); o["unknown_type"] != 1 || o["enqueued"] != 1 || o["ignored"] != 0 {
		t.Errorf("outcomes %v, want 1 unknown_type, 1 enqueued", o)
	}
}
