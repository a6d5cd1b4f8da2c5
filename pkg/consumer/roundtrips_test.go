package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgnotify"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// The round trips of a message, pinned (ADR 0023): a handler that writes
// one statement and announces it, like billing's intake (enqueue, wake the
// workers), costs BEGIN with the savepoint and the marker's claim, its
// statement, and COMMIT with the notification; each further message of the
// batch adds the release of the previous savepoint with its own savepoint
// and claim, and its statement. A refused message adds the rollback to its
// savepoint and the park.
func TestRoundTripsPerMessage(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, consumer.Migrations(""), parked.Migrations(""))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (order_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(pool, consumer.Handler[*testpb.OrderCompleted]{
		Name: "shipping",
		Decode: func(m *pubsub.Received, env envelope.Config) envelope.Verdict[*testpb.OrderCompleted] {
			return envelope.Decode[*testpb.OrderCompleted](m, env, nil)
		},
		Apply: func(ctx context.Context, tx pgx.Tx, ev *testpb.OrderCompleted, _ *pubsub.Received) (string, error) {
			if ev.GetQuantity() == 0 {
				return "", retry.Permanent(errors.New("nothing to ship"))
			}
			if _, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1)`, ev.GetOrderId()); err != nil {
				return "", err
			}
			return "shipped", pgnotify.Notify(ctx, tx, pgnotify.Notification{Channel: "shipments"})
		},
	}, consumer.Config{Subscription: subscription}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	process := func(ms ...*pubsub.Received) []string {
		t.Helper()
		outs, errs := c.Process(ctx, ms)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		return outs
	}
	process(order(t, "warm-1", 1), order(t, "warm-2", 0), order(t, "warm-3", 1)) // the statement cache
	for _, tc := range []struct {
		name     string
		ms       []*pubsub.Received
		outcomes string
		want     int64
	}{
		{"one message", []*pubsub.Received{order(t, "o-1", 1)}, "[shipped]", 3},
		{"a duplicate", []*pubsub.Received{order(t, "o-1", 1)}, "[duplicate]", 3},
		{"three messages", []*pubsub.Received{order(t, "o-2", 1), order(t, "o-3", 1), order(t, "o-4", 1)}, "[shipped shipped shipped]", 7},
		{"one refused between two", []*pubsub.Received{order(t, "o-5", 1), order(t, "o-6", 0), order(t, "o-7", 1)}, "[shipped parked shipped]", 8},
	} {
		rt.Reset()
		outs := process(tc.ms...)
		got := rt.Load()
		if fmt.Sprint(outs) != tc.outcomes {
			t.Errorf("%s: outcomes %v, want %s", tc.name, outs, tc.outcomes)
		}
		if got != tc.want {
			t.Errorf("%s: %d round trips, want %d", tc.name, got, tc.want)
		}
	}
	var shipped, markers, parkedRows int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM shipments WHERE order_id LIKE 'o-%'),
		(SELECT count(*) FROM processed_events WHERE event_id LIKE 'e-o-%'),
		(SELECT count(*) FROM parked_messages WHERE message_id = 'm-o-6' AND reason = 'nothing to ship')`).Scan(&shipped, &markers, &parkedRows); err != nil {
		t.Fatal(err)
	}
	if shipped != 6 || markers != 6 || parkedRows != 1 {
		t.Fatalf("shipments %d, markers %d, parked %d; want 6, 6, 1", shipped, markers, parkedRows)
	}
}

// A marker the database refuses (here: a consumer name over the table's
// limit) is isolated like a refusal by Apply, whether its message opens the
// batch's transaction or not: parked with the rule, nothing applied.
func TestMarkerRefusedByTheDatabaseIsParked(t *testing.T) {
	t.Parallel()
	s := setupShipping(t, "")
	c, err := consumer.New(s.pool, consumer.Handler[*testpb.OrderCompleted]{
		Name: strings.Repeat("x", 101),
		Decode: func(m *pubsub.Received, env envelope.Config) envelope.Verdict[*testpb.OrderCompleted] {
			return envelope.Decode[*testpb.OrderCompleted](m, env, nil)
		},
		Apply: func(ctx context.Context, tx pgx.Tx, ev *testpb.OrderCompleted, _ *pubsub.Received) (string, error) {
			_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1)`, ev.GetOrderId())
			return "shipped", err
		},
	}, consumer.Config{Subscription: subscription}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	outs, errs := c.Process(context.Background(), []*pubsub.Received{order(t, "o-1", 1), order(t, "o-2", 1)})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(outs) != "[parked parked]" {
		t.Fatalf("outcomes %v", outs)
	}
	if n := s.count(t, `SELECT count(*) FROM parked_messages WHERE reason LIKE 'rejected by the database:%processed_events_consumer_check%'`); n != 2 {
		t.Fatalf("parked with the rule: %d, want 2", n)
	}
	if n := s.count(t, `SELECT count(*) FROM shipments`); n != 0 {
		t.Fatalf("shipments %d, want 0", n)
	}
}
