package outboxpubsub_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/outboxpubsub"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// outage makes the emulator refuse every Publish with UNAVAILABLE while on,
// and counts the refusals.
type outage struct {
	on      atomic.Bool
	refused atomic.Int64
}

func (o *outage) React(any) (bool, any, error) {
	if o.on.Load() {
		o.refused.Add(1)
		return true, nil, status.Error(codes.Unavailable, "injected outage")
	}
	return false, nil, nil
}

// F16: while Pub/Sub refuses publishes, the outbox keeps the event, charges
// it nothing (the outage is Pub/Sub's, not the event's) and probes Pub/Sub
// through the topic's circuit; when Pub/Sub is back, the event is published
// with its own event_id, exactly the bytes committed with the business
// change, on its first recorded attempt.
func TestF16_PubSubUnavailable_OutboxRetriesThenPublishesSameEventID(t *testing.T) {
	t.Parallel()
	down := &outage{}
	down.on.Store(true)
	emu := pubsubtest.New(t, testTopology(), pstest.ServerReactorOption{FuncName: "Publish", Reactor: down})
	pool := pgtest.NewPool(t, outbox.Migrations(""))
	ctx := context.Background()

	ev := newEvent(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Append(ctx, tx, ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	relay, err := outbox.NewRelay(pool, map[string]outbox.Dispatcher{ev.Type: outboxpubsub.New(publisher(t, emu, pubsub.PublisherConfig{Timeout: 300 * time.Millisecond}))},
		outbox.Config{PollInterval: 20 * time.Millisecond, SweepInterval: 20 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, MaxAttempts: 3,
			CircuitThreshold: 2, CircuitProbeInterval: 50 * time.Millisecond, CircuitProbeIntervalMax: 100 * time.Millisecond},
		logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = relay.Run(runCtx) })
	t.Cleanup(func() { stop(); wg.Wait() })

	// More refused publishes than MaxAttempts: charged, they would have
	// moved the event to FAILED.
	waitfor.Condition(t, 20*time.Second, "outbox retries during the outage", func() bool {
		return down.refused.Load() >= 6
	})
	// Kept and retried: PENDING in the outbox (an attempt in flight is a row
	// lock, not a status), never FAILED, never PUBLISHED, and not charged.
	if st, n := eventStatus(t, pool, ev), attempts(t, pool, ev); st != "PENDING" || n != 0 {
		t.Fatalf("during the outage the event is %s with %d attempts, want PENDING with none charged", st, n)
	}

	down.on.Store(false)
	waitfor.Value(t, 10*time.Second, "event published after the outage", "PUBLISHED", func() string { return eventStatus(t, pool, ev) })
	// Moved to outbox_published with one attempt: the one that succeeded.
	if n := attempts(t, pool, ev); n != 1 {
		t.Fatalf("published with %d attempts, want 1 (the outage charged none)", n)
	}
	var undelivered int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&undelivered); err != nil || undelivered != 0 {
		t.Fatalf("undelivered outbox rows: %d (%v), want 0", undelivered, err)
	}

	got := receiveOne(t, emu)
	if got.Attributes[pubsub.AttrEventID] != ev.ID.String() {
		t.Fatalf("published event_id %q, want the outbox row's %s", got.Attributes[pubsub.AttrEventID], ev.ID)
	}
}

// attempts and eventStatus read the event wherever it is (outbox_events:
// the outbox while undelivered, outbox_published once delivered).
func attempts(t *testing.T, pool *pgxpool.Pool, ev outbox.Event) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT attempts FROM outbox_events WHERE event_id = $1", ev.ID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func eventStatus(t *testing.T, pool *pgxpool.Pool, ev outbox.Event) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), "SELECT status FROM outbox_events WHERE event_id = $1", ev.ID).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func receiveOne(t *testing.T, emu *pubsubtest.Emulator) *pubsub.Received {
	t.Helper()
	sub, err := pubsub.NewSubscriber(emu.Client, subB, pubsub.SubscriberConfig{BatchConcurrency: 1},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan *pubsub.Received, 16)
	go func() {
		_ = sub.RunBatch(ctx, func(_ context.Context, ms []*pubsub.Received) []error {
			for _, m := range ms {
				got <- m
			}
			return make([]error, len(ms))
		})
	}()
	select {
	case m := <-got:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message on workorder-events")
		return nil
	}
}
