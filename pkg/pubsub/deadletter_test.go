package pubsub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
)

// The dead-letter depth is counted by peeking: every waiting message is
// counted once, none is consumed, and a second count sees the same number.
func TestDeadLetterMonitorCountsWithoutConsuming(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, testTopology())
	ctx := context.Background()
	mon, err := pubsub.NewDeadLetterMonitor(emu.Client, pubsub.DeadLetterMonitorConfig{
		Subscriptions: []string{subBDeadLetter}, PullTimeout: 300 * time.Millisecond,
	}, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := mon.Count(ctx, subBDeadLetter); err != nil || n != 0 {
		t.Fatalf("empty subscription: count %d, %v; want 0", n, err)
	}
	pub, err := pubsub.NewPublisher(emu.Client, topicBDeadLetter, pubsub.DefaultPublisherConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	const letters = 7
	for i := range letters {
		publish(t, pub, "00000000-0000-0000-0000-000000000001", fmt.Sprintf("dead-%d", i))
	}
	for range 2 {
		if n, err := mon.Count(ctx, subBDeadLetter); err != nil || n != letters {
			t.Fatalf("count %d, %v; want %d", n, err, letters)
		}
	}
	for _, m := range emu.Server.Messages() {
		if m.Acks != 0 {
			t.Fatalf("message %s acked %d times by a count; counting must not consume", m.Attributes[pubsub.AttrEventID], m.Acks)
		}
	}
}
