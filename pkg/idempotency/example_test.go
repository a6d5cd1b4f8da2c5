package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// A create call protected by a key: the retry gets the stored response and
// creates nothing; the same key with another payload is refused.
func Example() {
	dsn, drop := pgtest.ExampleDatabase(idempotency.Migrations(""))
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY, item text)`); err != nil {
		panic(err)
	}
	store, err := idempotency.NewStore(pool, idempotency.Config{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		panic(err)
	}

	// createOrder is the API handler: the key and the order commit together.
	createOrder := func(key, item string) (*wrapperspb.StringValue, bool, error) {
		req, err := idempotency.NewRequest("orders.Create", key, wrapperspb.String(item))
		if err != nil {
			return nil, false, err
		}
		var resp *wrapperspb.StringValue
		var replayed bool
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			resp, replayed, err = idempotency.Do(ctx, store, tx, req, func(ctx context.Context) (*wrapperspb.StringValue, error) {
				var id int64
				if err := tx.QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, item).Scan(&id); err != nil {
					return nil, err
				}
				return wrapperspb.String(fmt.Sprintf("order %d: %s", id, item)), nil
			})
			return err
		})
		return resp, replayed, err
	}

	resp, replayed, err := createOrder("3f1c9a70-key", "coffee")
	fmt.Println(resp.GetValue(), "replayed:", replayed, "error:", err)
	resp, replayed, err = createOrder("3f1c9a70-key", "coffee")
	fmt.Println(resp.GetValue(), "replayed:", replayed, "error:", err)
	_, _, err = createOrder("3f1c9a70-key", "tea")
	fmt.Println("other payload refused:", errors.Is(err, idempotency.ErrMismatch))
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("orders:", n)
	// Output:
	// order 1: coffee replayed: false error: <nil>
	// order 1: coffee replayed: true error: <nil>
	// other payload refused: true
	// orders: 1
}
