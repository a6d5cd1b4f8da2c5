package outboxpubsub_test

// Benchmark B1p of docs/performance.md: the outbox relay (claim ->
// publish to the Pub/Sub emulator -> mark) drains a backlog, against two
// anchors measured in the same run, round by round (A B A B): the keyset
// 100-row claim on the same database (as in B1, bench/outbox) and the
// publish-only ceiling of our Publisher on the same emulator, no database.
// Target: relay >= 0.7 x min(keyset, ceiling), the median of the per-round
// ratios. Run with `make bench` (fsync on).
//
//	OUTBOX_B1P_EVENTS            backlog size (default 20000; pstest keeps every message in memory)
//	OUTBOX_B1P_ROUNDS            A/B rounds (default 2)
//	OUTBOX_BENCH_ANCHOR_SECONDS  time box of each keyset claim loop (default 10)

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/outboxpubsub"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
)

// ceilingInFlight is the most publishes the relay awaits at once with the
// default Config: DispatchConcurrency aggregates in each of BatchesInFlight
// batches. The ceiling runs at that concurrency, so it bounds the relay.
const ceilingInFlight = outbox.DefaultDispatchConcurrency * outbox.DefaultBatchesInFlight

// Trace and correlation headers of every benchmark event; the dispatcher
// copies them to message attributes, and so does the ceiling.
const (
	b1pTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b1pCorrelation = "bench"
)

// b1pRig is what the three measurements share: one database, one emulator
// and the event (type and encoded payload).
type b1pRig struct {
	b         *testing.B
	dsn       string
	pool      *pgxpool.Pool
	emu       *pubsubtest.Emulator
	eventType string
	payload   []byte
	n         int
}

// BenchmarkB1p_RelayToPubSub: the relay with the production Pub/Sub
// dispatcher drains n events the size of a typical domain event (the
// work-order service's completion, with the same field values) to the emulator; the keyset claim and the publish-only ceiling are measured
// between its runs. Every drain must publish each event exactly once, with
// its row's event_id, payload and ordering key, in id order per key.
func BenchmarkB1p_RelayToPubSub(b *testing.B) {
	n := benchkit.EnvInt(b, "OUTBOX_B1P_EVENTS", 20_000)
	rounds := benchkit.EnvInt(b, "OUTBOX_B1P_ROUNDS", 2)
	anchorFor := time.Duration(benchkit.EnvInt(b, "OUTBOX_BENCH_ANCHOR_SECONDS", 10)) * time.Second
	ev := &eventsv1.WorkOrderCompletionRecorded{
		EventId: "0196f1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1b", WorkOrderId: "wo-000123", CustomerId: "cust-0042",
		Description: "Replace the pump seal and pressure-test the line", Positions: 3, CompletedItems: 3,
		UnitPrice:   &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 12345},
		CompletedAt: timestamppb.New(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)),
	}
	payload, err := proto.Marshal(ev)
	if err != nil {
		b.Fatal(err)
	}
	dsn := pgtest.NewDatabase(b, outbox.Migrations(""))
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	r := &b1pRig{
		b: b, dsn: dsn, pool: pool, n: n, payload: payload,
		eventType: string(proto.MessageName(ev)),
		// The production topic without its subscription: pstest rescans every
		// subscription's unacked messages under its global lock every 10 ms,
		// so an undrained subscription would make the publish rate a function
		// of pstest's backlog (see pkg/pubsub BenchmarkPublish). Consuming is B4.
		emu: pubsubtest.New(b, pubsub.Topology{Topics: []pubsub.Topic{{ID: topicB}}}),
	}
	for b.Loop() {
		var keyset, ceiling, relay, rMin, rK, rC []float64
		for round := range rounds {
			k := benchkit.Anchor(b, pool, benchkit.Keyset, n, anchorFor)
			c := r.ceiling()
			rl := r.relay()
			keyset, ceiling, relay = append(keyset, k), append(ceiling, c), append(relay, rl)
			rMin, rK, rC = append(rMin, rl/min(k, c)), append(rK, rl/k), append(rC, rl/c)
			b.Logf("B1p round %d: events=%d keyset=%.0f rows/s ceiling=%.0f msg/s (in-flight %d) relay=%.0f rows/s; relay/min(keyset,ceiling)=%.2f relay/keyset=%.2f relay/ceiling=%.2f",
				round, n, k, c, ceilingInFlight, rl, rl/min(k, c), rl/k, rl/c)
		}
		b.ReportMetric(benchkit.Median(relay), "relay_rows/s")
		b.ReportMetric(benchkit.Median(keyset), "keyset_rows/s")
		b.ReportMetric(benchkit.Median(ceiling), "ceiling_msg/s")
		b.ReportMetric(benchkit.Median(rMin), "relay/min_anchor")
		b.ReportMetric(benchkit.Median(rK), "relay/keyset")
		b.ReportMetric(benchkit.Median(rC), "relay/ceiling")
		b.Logf("B1p go=%s GOMAXPROCS=%d fsync=%s rounds=%d target: relay/min_anchor >= 0.7",
			runtime.Version(), runtime.GOMAXPROCS(0), os.Getenv(benchkit.EnvFsync), rounds)
	}
}

// ceiling publishes n messages shaped like the relay's (payload, attributes,
// ordering keys) with ceilingInFlight concurrent awaited publishes and
// returns messages per second.
func (r *b1pRig) ceiling() float64 {
	b := r.b
	pgtest.Checkpoint(b) // the previous measurement's dirty pages are not flushed during this one
	pub := r.publisher()
	defer pub.Stop()
	aggregates := max(r.n/4, 1)
	errs := make([]error, ceilingInFlight)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range ceilingInFlight {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(r.n); i = next.Add(1) - 1 {
				attrs := pubsub.EventAttributes(uuid.Must(uuid.NewV7()).String(), r.eventType, 1, time.Now())
				attrs[pubsub.AttrTraceparent], attrs[pubsub.AttrCorrelationID] = b1pTraceparent, b1pCorrelation
				if _, err := pub.PublishRaw(context.Background(), r.payload, attrs, "wo-"+strconv.FormatInt(i%int64(aggregates), 10)); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	if got := len(r.emu.Server.Messages()); got != r.n {
		b.Fatalf("ceiling: emulator holds %d messages, want %d", got, r.n)
	}
	r.emu.Server.ClearMessages()
	return float64(r.n) / elapsed.Seconds()
}

// relay fills the outbox with n events, runs one relay (default Config, its
// own pool, the production dispatcher) until the outbox is empty, checks the
// effect and returns rows per second.
func (r *b1pRig) relay() float64 {
	b, ctx := r.b, context.Background()
	benchkit.Fill(b, r.pool, benchkit.Backlog{
		Events: r.n, EventType: r.eventType, Payload: r.payload,
		Headers: map[string]string{outbox.HeaderCorrelationID: b1pCorrelation, outbox.HeaderTraceparent: b1pTraceparent},
	})

	pub := r.publisher()
	defer pub.Stop()
	relayPool, err := pgxpool.New(ctx, r.dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer relayPool.Close()
	// Counting successful dispatches lets the wait poll a counter instead of
	// a count(*) that would compete with the relay for the database.
	d := outboxpubsub.New(pub)
	var published atomic.Int64
	counted := outbox.DispatcherFunc(func(ctx context.Context, ev outbox.Event) (outbox.Commit, error) {
		c, err := d.Dispatch(ctx, ev)
		if err == nil {
			published.Add(1)
		}
		return c, err
	})
	relay, err := outbox.NewRelay(relayPool, map[string]outbox.Dispatcher{r.eventType: counted}, outbox.Config{},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		b.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()

	start := time.Now()
	wg.Go(func() { _ = relay.Run(runCtx) })
	benchkit.WaitDrained(b, r.pool, r.n, published.Load)
	elapsed := time.Since(start)
	stop()
	wg.Wait()
	if got := published.Load(); got != int64(r.n) {
		b.Fatalf("%d publishes for %d events: a batch was dispatched twice", got, r.n)
	}
	r.verifyDelivered()
	r.emu.Server.ClearMessages()
	return float64(r.n) / elapsed.Seconds()
}

// verifyDelivered checks the business effect of a drain: outbox_published
// holds the n events, and the emulator got exactly one message per event,
// with the row's event_id, payload and aggregate as ordering key, and the
// events of each aggregate in id order.
func (r *b1pRig) verifyDelivered() {
	b := r.b
	type row struct {
		id  int64
		agg string
	}
	byEventID := make(map[string]row, r.n)
	rows, err := r.pool.Query(context.Background(), `SELECT event_id::text, id, aggregate_id FROM outbox_published`)
	if err != nil {
		b.Fatal(err)
	}
	var eventID string
	var x row
	if _, err := pgx.ForEachRow(rows, []any{&eventID, &x.id, &x.agg}, func() error { byEventID[eventID] = x; return nil }); err != nil {
		b.Fatal(err)
	}
	if len(byEventID) != r.n {
		b.Fatalf("outbox_published holds %d events, want %d", len(byEventID), r.n)
	}
	msgs := r.emu.Server.Messages()
	if len(msgs) != r.n {
		b.Fatalf("emulator holds %d messages for %d events", len(msgs), r.n)
	}
	lastID := make(map[string]int64, r.n/4+1)
	for _, m := range msgs { // in the order the emulator accepted them
		id := m.Attributes[pubsub.AttrEventID]
		ev, ok := byEventID[id]
		switch {
		case !ok:
			b.Fatalf("message with event_id %q: no such published event, or published twice", id)
		case m.OrderingKey != ev.agg:
			b.Fatalf("event %s: ordering key %q, want its aggregate %q", id, m.OrderingKey, ev.agg)
		case ev.id <= lastID[ev.agg]:
			b.Fatalf("aggregate %s: event id %d published after id %d", ev.agg, ev.id, lastID[ev.agg])
		case !bytes.Equal(m.Data, r.payload):
			b.Fatalf("event %s: payload changed on the way", id)
		}
		lastID[ev.agg] = ev.id
		delete(byEventID, id)
	}
}

func (r *b1pRig) publisher() *pubsub.Publisher {
	pub, err := pubsub.NewPublisher(r.emu.Client, topicB, pubsub.DefaultPublisherConfig())
	if err != nil {
		r.b.Fatal(err)
	}
	return pub
}
