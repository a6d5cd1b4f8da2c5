package receiver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/workorder/internal/correlation"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// Storing a completion in the inbox costs one round trip (ADR 0023):
// BEGIN, insert, conflicts, COMMIT and the relay's wake-up in one pipeline.
// Four before.
func TestRoundTripsOfStoringOneCompletion(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, migrations.WorkOrder()...)
	store, err := inbox.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := receiver.Handle(store, decoder(t), quiet)
	received := func(eventID string) *pubsub.Received {
		order := uuid.New()
		data, err := proto.Marshal(&eventsv1.WorkOrderCompleted{EventId: eventID, WorkOrderId: order.String(), CompletedItems: 3})
		if err != nil {
			t.Fatal(err)
		}
		attrs := pubsub.EventAttributes(eventID, correlation.TypeCompleted, 1, time.Now())
		return &pubsub.Received{ID: "m-" + eventID, Data: data, Attributes: attrs, OrderingKey: order.String()}
	}
	ctx := context.Background()
	if err := errors.Join(h(ctx, []*pubsub.Received{received("warm")})...); err != nil { // the statement cache
		t.Fatal(err)
	}
	rt.Reset()
	if err := errors.Join(h(ctx, []*pubsub.Received{received("c1")})...); err != nil {
		t.Fatal(err)
	}
	if n := rt.Load(); n != 1 {
		t.Errorf("round trips %d, want 1", n)
	}
	b := bundle{pool: pool}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE event_id = 'c1' AND status = 'OPEN'`); n != 1 {
		t.Fatalf("open entries of c1: %d, want 1", n)
	}
}
