package parked_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// A consumer parks a message it cannot decode, and an operator lists it.
func Example() {
	ctx := context.Background()
	dsn, drop := pgtest.ExampleDatabase(parked.Migrations(""))
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := parked.New()
	if err != nil {
		panic(err)
	}

	// Normally in the transaction that handles the message's batch-mates.
	if _, err := store.Park(ctx, pool, parked.Message{
		Subscription: "invoicing.order-events",
		MessageID:    "1001",
		Attributes:   map[string]string{"event_type": "orders.v1.OrderCompleted", "correlation_id": "req\x00-1"},
		Data:         []byte{0xff, 0xfe},
		Reason:       "unparseable payload",
	}); err != nil {
		panic(err)
	}

	open, err := store.List(ctx, pool, parked.ListFilter{})
	if err != nil {
		panic(err)
	}
	for _, p := range open {
		fmt.Printf("%d %s/%s: %s (%d bytes)\n", p.ID, p.Subscription, p.MessageID, p.Reason, len(p.Data))
	}
	// Output:
	// 1 invoicing.order-events/1001: unparseable payload; stored escaped: attributes (2 bytes)
}
