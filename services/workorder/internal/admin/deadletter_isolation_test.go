package admin_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
)

// A dead letter the database cannot store as received (a NUL byte in its
// event id) does not fail the replay of the others: the good ones re-enter
// OPEN, the bad one is parked as poison with its raw payload, and all of
// them are acked (a further replay finds nothing).
func TestReplayDeadLetters_BadMessageParkedGoodOnesReplayed(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	b := setup(t, emu.Client)
	ctx := context.Background()
	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicWorkOrderCompletedDeadLetter, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	order := uuid.NewString()
	for _, id := range []string{"d1", "bad\x00id", "d2"} {
		if _, err := pub.Publish(ctx, pubsub.Message{EventID: id, OrderingKey: order,
			Event: &eventsv1.WorkOrderCompleted{EventId: id, WorkOrderId: order, CompletedItems: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	ops := inProcessOps(t, b)
	req := &opsv1.ReplayDeadLettersRequest{Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-7", Actor: "alice"},
		Consumer: admin.ConsumerInbox, MaxMessages: 10}
	for range 20 { // pstest may hand out the messages over several pulls
		if _, err := ops.ReplayDeadLetters(ctx, req); err != nil {
			t.Fatalf("one bad dead letter must not fail the replay: %v", err)
		}
		if b.count(t, `SELECT count(*) FROM inbox`) == 3 {
			break
		}
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE status = 'OPEN' AND event_id IN ('d1', 'd2')`); n != 2 {
		t.Fatalf("good dead letters re-entered = %d, want 2", n)
	}
	var key, lastErr string
	if err := b.pool.QueryRow(ctx, `SELECT event_id, last_error FROM inbox WHERE status = 'PARKED' AND park_reason = 'POISON' AND length(payload) > 0`).Scan(&key, &lastErr); err != nil {
		t.Fatalf("bad dead letter not parked: %v", err)
	}
	if !strings.HasPrefix(key, "pubsub-message:") || !strings.Contains(lastErr, "NUL byte") {
		t.Fatalf("parked under %q with %q", key, lastErr)
	}
	res, err := ops.ReplayDeadLetters(ctx, req)
	if err != nil || len(res.GetMessageIds()) != 0 || b.count(t, `SELECT count(*) FROM inbox`) != 3 {
		t.Fatalf("everything must be acked after the replay: %v %v", res, err)
	}
}
