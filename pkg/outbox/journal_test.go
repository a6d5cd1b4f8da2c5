package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// onePool is a pool of b's database that holds a single connection: every
// claim transaction takes all of it.
func onePool(t *testing.T, b *bundle) *pgxpool.Pool {
	t.Helper()
	cfg := b.pool.Config()
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 1, 0, 0
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// The journal's statements commit on their own while the batch's claim
// transaction holds a connection of the pool. Taken from the same pool, they
// waited for a connection held by claims that waited for them: with every
// connection in a claim, no batch went out until the lease expired (and a
// batch that got its journal late ran out of lease while settling, so its
// events were dispatched again). With a pool of one connection that wait is
// certain.
func TestBatchGoesOutWhenTheClaimsHoldEveryPooledConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var evs []outbox.Event
	for i := range 3 {
		evs = append(evs, event(fmt.Sprintf("agg-%d", i), 0))
	}
	appendCommitted(t, b.pool, evs...)

	// A lease far longer than the test tolerates: the batch must not wait
	// for it.
	r := b.relay(t, onePool(t, b), outbox.Config{LeaseDuration: 5 * time.Second})
	start := time.Now()
	if _, err := r.ProcessBatch(context.Background()); err != nil {
		t.Fatalf("batch on a one-connection pool: %v (after %s)", err, time.Since(start))
	}
	for _, ev := range evs {
		if got := rowOf(t, b.pool, ev.ID); got.Status != "PUBLISHED" || got.Attempts != 1 {
			t.Errorf("event of %s: %+v, want PUBLISHED after one attempt", ev.AggregateID, got)
		}
	}
	if n := b.rec.count.Load(); n != int64(len(evs)) {
		t.Errorf("%d dispatches, want %d", n, len(evs))
	}
	assertJournalEmpty(t, b)
}

func TestRunDrainsWhenTheClaimsHoldEveryPooledConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, onePool(t, b), outbox.Config{
		BatchSize: 4, LeaseDuration: time.Minute, PollInterval: 20 * time.Millisecond,
	}, outbox.WithClock(time.Now))
	stop := runRelay(t, r)
	var evs []outbox.Event
	for i := range 20 {
		evs = append(evs, event(fmt.Sprintf("agg-%d", i%5), i/5))
	}
	appendCommitted(t, b.pool, evs...)
	// 20 s: a loaded machine, and a third of the lease.
	waitfor.Condition(t, 20*time.Second, "every event published", func() bool {
		return countStatus(t, b.pool, "PUBLISHED") == len(evs)
	})
	stop()
	if n := b.rec.count.Load(); n != int64(len(evs)) {
		t.Errorf("%d dispatches, want %d", n, len(evs))
	}
	assertJournalEmpty(t, b)
}

// assertJournalEmpty checks that settled batches left no journal row behind:
// a row left behind makes the next claim of its events dispatch them one at
// a time, as after a crash.
func assertJournalEmpty(t *testing.T, b *bundle) {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_dispatching`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d journal rows left behind with no crash, want 0", n)
	}
}
