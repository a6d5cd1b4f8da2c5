package consumer_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// A consumer that owns its loop receives the same event twice (a
// redelivery after a lost ack): the marker, claimed in the effect's
// transaction, lets the effect happen once.
func ExampleMarkers_Claim() {
	dsn, drop := pgtest.ExampleDatabase(consumer.Migrations(""))
	defer drop()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE shipments (order_id text)`); err != nil {
		panic(err)
	}

	markers, err := consumer.NewMarkers()
	if err != nil {
		panic(err)
	}
	consume := func(ev consumer.Marker) consumer.Outcome {
		var out consumer.Outcome
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var err error
			if out, err = markers.Claim(ctx, tx, ev); err != nil || out != consumer.Claimed {
				return err // Duplicate or Conflict: apply nothing, commit, ack
			}
			_, err = tx.Exec(ctx, `INSERT INTO shipments VALUES ('o-1')`)
			return err
		})
		if err != nil {
			panic(err) // nack: the broker redelivers
		}
		return out
	}
	ev := consumer.Marker{Consumer: "shipping", ID: "evt-42", Type: "OrderPaid", Payload: []byte(`{"order":"o-1"}`)}
	fmt.Println(consume(ev))
	fmt.Println(consume(ev))

	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("shipments:", n)
	// Output:
	// claimed
	// duplicate
	// shipments: 1
}
