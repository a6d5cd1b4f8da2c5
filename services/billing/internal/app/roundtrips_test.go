package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// The round trips of one invoice job, pinned: at a database's distance each
// is a network round trip of the invoice hop (B7). A worker starts with one
// job waiting and runs it to the end: the rescue of expired leases (the
// first loop, as after an idle RescueInterval), the claim, the handler's
// fenced completion (invoice and InvoiceIssued in the done mark's
// transaction) and the wake-up of billing's outbox relay. The job is
// enqueued and observed through a pool that is not counted. A change that
// adds a round trip fails here.
func TestInvoiceJobRoundTrips(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, migrations.Billing()...)
	b := setupOn(t, pool)
	ctx := context.Background()
	pcfg := pool.Config()
	pcfg.ConnConfig.Tracer = nil
	plain, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.Close)
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := plain.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	cfg := b.cfg.Worker
	// Nothing but the job: no LISTEN, no second poll, no second rescue.
	cfg.DisableListen, cfg.PollInterval, cfg.RescueInterval, cfg.FullScanInterval = true, time.Hour, time.Hour, time.Hour
	one := func() int64 {
		t.Helper()
		orderID := uuid.New()
		payload, err := proto.Marshal(completion(orderID))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.c.Queue.Enqueue(ctx, plain, leasequeue.NewJob{UniqueKey: orderID.String(), Payload: payload}); err != nil {
			t.Fatal(err)
		}
		w, err := leasequeue.NewWorker(b.c.Queue, b.c.Issuer.Handle, cfg)
		if err != nil {
			t.Fatal(err)
		}
		rt.Reset()
		stop := start(t, "worker", w.Run)
		waitfor.Value(t, 10*time.Second, "job done", 1, func() int {
			return count(`SELECT count(*) FROM leasequeue_jobs WHERE unique_key = $1 AND state = 'done' AND epoch = 1`, orderID.String())
		})
		stop() // Run returns once its completions (and their wake-ups) are sent
		n := rt.Load()
		if got := count(`SELECT count(*) FROM invoices WHERE work_order_id = $1`, orderID); got != 1 {
			t.Fatalf("invoices of the order: %d, want 1", got)
		}
		if got := count(`SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND event_type = 'lossless.events.v1.InvoiceIssued'`, orderID.String()); got != 1 {
			t.Fatalf("InvoiceIssued in the outbox: %d, want 1", got)
		}
		return n
	}
	one() // warms the connections' statement caches
	if got, want := one(), int64(5); got != want {
		t.Fatalf("one invoice job: %d round trips, want %d", got, want)
	}
}
