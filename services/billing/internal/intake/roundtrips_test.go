package intake_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

// A completion costs three round trips at a database's distance (ADR
// 0023): BEGIN with the savepoint and the marker's claim, the job's
// enqueue, COMMIT with the workers' wake-up. Seven before.
func TestRoundTripsOfOneCompletion(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, migrations.Billing()...)
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
	queue, err := leasequeue.New(pool, leasequeue.Config{Name: "invoices"}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := intake.New(pool, queue, intake.Config{}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{pool: pool, in: in}
	ctx := context.Background()
	if err := in.Handle(ctx, message(t, completion())); err != nil { // the statement cache
		t.Fatal(err)
	}
	ev := completion()
	rt.Reset()
	outs, errs := in.Process(ctx, []*pubsub.Received{message(t, ev)})
	if n := rt.Load(); n != 3 {
		t.Errorf("round trips %d, want 3", n)
	}
	wantAcked(t, errs)
	if outs[0] != intake.OutcomeEnqueued {
		t.Fatalf("outcome %q", outs[0])
	}
	b.wantJob(t, ev)
	if n := b.count(t, `SELECT count(*) FROM processed_events WHERE event_id = $1`, ev.GetEventId()); n != 1 {
		t.Fatalf("markers %d, want 1", n)
	}
}
