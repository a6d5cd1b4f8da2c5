package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

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

const subscription = "shipping.orders"

// shipping is a consumer that ships each order once; an order with no
// quantity is refused (a permanent error), and refused is what the test
// flips to make apply fail like an infrastructure failure.
type shipping struct {
	pool *pgxpool.Pool
	c    *consumer.Consumer[*testpb.OrderCompleted]
}

func newShipping(t *testing.T, pool *pgxpool.Pool, failOn string) *shipping {
	t.Helper()
	c, err := consumer.New(pool, consumer.Handler[*testpb.OrderCompleted]{
		Name: "shipping",
		Decode: func(m *pubsub.Received, env envelope.Config) envelope.Verdict[*testpb.OrderCompleted] {
			return envelope.Decode[*testpb.OrderCompleted](m, env, nil)
		},
		Apply: func(ctx context.Context, tx pgx.Tx, ev *testpb.OrderCompleted, _ *pubsub.Received) (string, error) {
			if ev.GetQuantity() == 0 {
				return "", retry.Permanent(errors.New("nothing to ship"))
			}
			if ev.GetOrderId() == failOn {
				return "", errors.New("transient failure")
			}
			_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1)`, ev.GetOrderId())
			return "shipped", err
		},
		Subject: (*testpb.OrderCompleted).GetOrderId,
	}, consumer.Config{Subscription: subscription}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return &shipping{pool: pool, c: c}
}

func setupShipping(t *testing.T, failOn string) *shipping {
	t.Helper()
	pool := pgtest.NewPool(t, consumer.Migrations(""), parked.Migrations(""))
	if _, err := pool.Exec(context.Background(), `CREATE TABLE shipments (order_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return newShipping(t, pool, failOn)
}

func order(t *testing.T, id string, qty int32) *pubsub.Received {
	t.Helper()
	data, err := proto.Marshal(&testpb.OrderCompleted{EventId: "e-" + id, OrderId: id, Quantity: qty})
	if err != nil {
		t.Fatal(err)
	}
	return &pubsub.Received{ID: "m-" + id, Data: data,
		Attributes: map[string]string{pubsub.AttrEventType: "lossless.pkgtest.v1.OrderCompleted"}}
}

func (s *shipping) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A refusal by apply (a permanent error) rolls back the message's marker
// and effects on its savepoint and parks it with the error's text; its
// batch-mates commit in the same transaction.
func TestRefusalIsParkedAndItsMarkerRolledBack(t *testing.T) {
	t.Parallel()
	s := setupShipping(t, "")
	ctx := context.Background()
	outs, errs := s.c.Process(ctx, []*pubsub.Received{order(t, "o-1", 1), order(t, "o-2", 0), order(t, "o-3", 1)})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(outs) != "[shipped parked shipped]" {
		t.Fatalf("outcomes %v", outs)
	}
	if n := s.count(t, `SELECT count(*) FROM shipments`); n != 2 {
		t.Fatalf("shipments %d, want 2", n)
	}
	if n := s.count(t, `SELECT count(*) FROM processed_events WHERE event_id = 'e-o-2'`); n != 0 {
		t.Fatal("marker of the refused message committed")
	}
	if n := s.count(t, `SELECT count(*) FROM parked_messages WHERE message_id = 'm-o-2' AND subject = 'o-2' AND reason = 'nothing to ship'`); n != 1 {
		t.Fatal("refused message not parked with its reason and subject")
	}
}

// The same event id with other content is a producer bug: parked, not
// taken for a duplicate.
func TestReusedEventIDIsParked(t *testing.T) {
	t.Parallel()
	s := setupShipping(t, "")
	ctx := context.Background()
	if err := s.c.Handle(ctx, order(t, "o-1", 1)); err != nil {
		t.Fatal(err)
	}
	other := order(t, "o-1", 2)
	other.ID = "m-other"
	outs, errs := s.c.Process(ctx, []*pubsub.Received{other})
	if errs[0] != nil || outs[0] != consumer.OutcomeParked {
		t.Fatalf("%v %v", outs, errs)
	}
	if n := s.count(t, `SELECT count(*) FROM parked_messages WHERE message_id = 'm-other' AND reason LIKE '%producer bug%'`); n != 1 {
		t.Fatal("conflict not parked as a producer bug")
	}
}

// When the batch's transaction fails on something a savepoint does not
// isolate, each message is applied in a transaction of its own: only the
// failing one nacks, its batch-mates commit.
func TestFailedBatchFallsBackToOneTransactionPerMessage(t *testing.T) {
	t.Parallel()
	s := setupShipping(t, "o-2")
	ctx := context.Background()
	outs, errs := s.c.Process(ctx, []*pubsub.Received{order(t, "o-1", 1), order(t, "o-2", 1), order(t, "o-3", 1)})
	if errs[0] != nil || errs[2] != nil || errs[1] == nil {
		t.Fatalf("errors %v, want only the second message nacked", errs)
	}
	if outs[0] != "shipped" || outs[1] != "" || outs[2] != "shipped" {
		t.Fatalf("outcomes %q", outs)
	}
	if n := s.count(t, `SELECT count(*) FROM shipments`); n != 2 {
		t.Fatalf("shipments %d, want 2", n)
	}
	if n := s.count(t, `SELECT count(*) FROM processed_events WHERE event_id = 'e-o-2'`); n != 0 {
		t.Fatal("marker of the nacked message committed: its redelivery would be lost")
	}
}

// Replay sends a parked message through the same path: refused while its
// cause stands (ErrStillRefused, the row open), applied once it is fixed,
// closed after.
func TestReplayThroughTheSamePath(t *testing.T) {
	t.Parallel()
	s := setupShipping(t, "o-1")
	ctx := context.Background()
	// A message parked by the database's rule: the table refuses it.
	if _, err := s.pool.Exec(ctx, `ALTER TABLE shipments ADD CONSTRAINT no_o2 CHECK (order_id <> 'o-2')`); err != nil {
		t.Fatal(err)
	}
	outs, errs := s.c.Process(ctx, []*pubsub.Received{order(t, "o-2", 1)})
	if errs[0] != nil || outs[0] != consumer.OutcomeParked {
		t.Fatalf("%v %v", outs, errs)
	}
	var id int64
	if err := s.pool.QueryRow(ctx, `SELECT id FROM parked_messages WHERE message_id = 'm-o-2'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Replay(ctx, s.pool, id, "", "bob"); !errors.Is(err, consumer.ErrAuditRequired) {
		t.Fatalf("replay without a ticket: %v", err)
	}
	if _, err := s.c.Replay(ctx, s.pool, id, "INC-1", "bob"); !errors.Is(err, consumer.ErrStillRefused) || !strings.Contains(err.Error(), "no_o2") {
		t.Fatalf("replay with the rule in place: %v", err)
	}
	if _, err := s.pool.Exec(ctx, `ALTER TABLE shipments DROP CONSTRAINT no_o2`); err != nil {
		t.Fatal(err)
	}
	if out, err := s.c.Replay(ctx, s.pool, id, "INC-1", "bob"); err != nil || out != "shipped" {
		t.Fatalf("replay: %v %v", out, err)
	}
	if _, err := s.c.Replay(ctx, s.pool, id, "INC-1", "bob"); !errors.Is(err, parked.ErrNotOpen) {
		t.Fatalf("second replay: %v", err)
	}
	if n := s.count(t, `SELECT count(*) FROM shipments WHERE order_id = 'o-2'`); n != 1 {
		t.Fatalf("shipments of o-2: %d, want 1", n)
	}
	// Another subscription's row is not this consumer's to replay.
	m := order(t, "o-4", 1)
	if err := s.pool.QueryRow(ctx, `INSERT INTO parked_messages (subscription, message_id, attributes, data, reason)
		VALUES ('audit.orders', $1, $2, $3, 'parked elsewhere') RETURNING id`, m.ID, m.Attributes, m.Data).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Replay(ctx, s.pool, id, "INC-2", "bob"); err == nil {
		t.Fatal("replayed another subscription's parked message")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg consumer.Config
		ok  bool
	}{
		{consumer.Config{Subscription: "s"}, true},
		{consumer.Config{}, false},
		{consumer.Config{Subscription: "s\x00"}, false},
		{consumer.Config{Subscription: "s", MaxPayloadBytes: 10<<20 + 1}, false},
		{consumer.Config{Subscription: "s", Concurrency: 65}, false},
		{consumer.Config{Subscription: "s", Concurrency: -1}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.cfg, err)
		}
	}
}
