package correlation_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/services/workorder/internal/correlation"
)

// Correlating a completion costs four round trips (ADR 0023): the inbox
// claim with the BEGIN, the order's locking reads, the writes with the
// outbox append, the entry's resolve with the COMMIT and the dispatcher's
// wake-up. Eight before the pipelining, five before the append rode the
// writes.
func TestRoundTripsOfCorrelatingOneCompletion(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, migrations.WorkOrder()...)
	store, err := inbox.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := inbox.NewOps(pool)
	if err != nil {
		t.Fatal(err)
	}
	b := bundle{pool: pool, store: store, ops: ops, handler: correlation.NewHandler()}
	relay, err := inbox.NewRelay(pool, b.handler, inbox.Config{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	process := func() {
		t.Helper()
		if n, err := relay.ProcessBatch(ctx); err != nil || n != 1 {
			t.Fatalf("batch: %d %v", n, err)
		}
	}
	warm := b.order(t, "HANDED_OFF", 10, 1) // the statement cache
	b.ingest(t, completed("warm", warm, 10))
	process()
	id := b.order(t, "HANDED_OFF", 10, 1)
	b.ingest(t, completed("c1", id, 10))
	rt.Reset()
	process()
	if n := rt.Load(); n != 4 {
		t.Errorf("round trips %d, want 4", n)
	}
	if e := b.entry(t, "c1"); e.Status != inbox.StatusApplied {
		t.Fatalf("entry %s", e.Status)
	}
	got := b.state(t, id)
	want := orderState{Status: "COMPLETED", Completed: 10, ConsumedBy: "inbox:c1", CompletionOutboxEvents: 1, OutboxTraceparent: traceparent}
	if got != want {
		t.Fatalf("state %+v, want %+v", got, want)
	}
}
