package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// A shipping service consumes OrderCompleted: it supplies a decoder and an
// apply function. One batch holds an event, its redelivery, an event apply
// refuses and bytes that do not parse: one shipment, two messages parked,
// everything acked.
func Example() {
	ctx := context.Background()
	dsn, drop := pgtest.ExampleDatabase(consumer.Migrations(""), parked.Migrations(""))
	defer drop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (order_id text PRIMARY KEY)`); err != nil {
		panic(err)
	}

	shipping, err := consumer.New(pool, consumer.Handler[*testpb.OrderCompleted]{
		Name: "shipping",
		Decode: func(m *pubsub.Received, env envelope.Config) envelope.Verdict[*testpb.OrderCompleted] {
			return envelope.Decode(m, env, func(ev *testpb.OrderCompleted) []string {
				if ev.GetOrderId() == "" {
					return []string{"order_id: missing"}
				}
				return nil
			})
		},
		Apply: func(ctx context.Context, tx pgx.Tx, ev *testpb.OrderCompleted, _ *pubsub.Received) (string, error) {
			if ev.GetQuantity() == 0 {
				return "", retry.Permanent(errors.New("nothing to ship"))
			}
			_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1)`, ev.GetOrderId())
			return "shipped", err
		},
		Subject:  (*testpb.OrderCompleted).GetOrderId,
		Outcomes: []string{"shipped"},
	}, consumer.Config{Subscription: "shipping.orders"}, slog.New(slog.DiscardHandler))
	if err != nil {
		panic(err)
	}

	message := func(id string, ev *testpb.OrderCompleted) *pubsub.Received {
		data, err := proto.Marshal(ev)
		if err != nil {
			panic(err)
		}
		return &pubsub.Received{ID: id, Data: data,
			Attributes: map[string]string{pubsub.AttrEventType: "lossless.pkgtest.v1.OrderCompleted"}}
	}
	shipped := message("m1", &testpb.OrderCompleted{EventId: "e1", OrderId: "o-1", Quantity: 2})
	redelivered := &pubsub.Received{ID: "m1", Data: shipped.Data, Attributes: shipped.Attributes}
	empty := message("m2", &testpb.OrderCompleted{EventId: "e2", OrderId: "o-2"})
	garbage := &pubsub.Received{ID: "m3", Data: []byte{0xff}, Attributes: shipped.Attributes}

	outcomes, errs := shipping.Process(ctx, []*pubsub.Received{shipped, redelivered, empty, garbage})
	fmt.Println(outcomes, errors.Join(errs...))

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("shipments:", n)
	// Output:
	// [shipped duplicate parked parked] <nil>
	// shipments: 1
}
