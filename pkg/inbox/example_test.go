package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// A receiver stores a message (and would ack it only now); the relay applies
// it later through the handler, whose write commits with the entry's status.
func Example() {
	dsn, drop := pgtest.ExampleDatabase(inbox.Migrations(""))
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE deliveries (order_id text PRIMARY KEY, delivered_at timestamptz)`); err != nil {
		panic(err)
	}

	store, err := inbox.NewStore(pool, nil)
	if err != nil {
		panic(err)
	}
	res, err := store.Ingest(ctx, []inbox.Message{{
		Source: "carrier", EventID: "evt-1", EventType: "carrier.v1.Delivered",
		CorrelationKey: "order-7", Payload: []byte(`{"order":"order-7"}`),
	}})
	if err != nil {
		panic(err) // nack: the broker redelivers
	}
	fmt.Println("inserted:", res.Inserted)

	apply := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, e *inbox.Entry) error {
		_, err := tx.Exec(ctx, `INSERT INTO deliveries VALUES ($1, now())`, e.CorrelationKey)
		return err // nil: APPLIED; inbox.Park / inbox.Defer: a business rejection
	})
	relay, err := inbox.NewRelay(pool, apply, inbox.Config{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()

	ops, err := inbox.NewOps(pool)
	if err != nil {
		panic(err)
	}
	var entry inbox.Entry
	applied := waitfor.Until(30*time.Second, func() bool {
		entry, err = ops.Get(ctx, 1)
		return err == nil && entry.Status == inbox.StatusApplied
	})
	stop()
	if err := <-done; err != nil || !applied {
		panic(fmt.Sprintf("not applied: %+v %v", entry, err))
	}
	fmt.Println(entry.EventID, entry.Status, "after", entry.Attempts, "attempt")
	// Output:
	// inserted: 1
	// evt-1 APPLIED after 1 attempt
}
