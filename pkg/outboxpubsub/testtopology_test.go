package outboxpubsub_test

import "github.com/lossless-dev/lossless/pkg/pubsub"

// The tests' own topology: one topic the dispatcher publishes to, read by
// one consumer subscription.
const (
	topicB = "events"
	subB   = "consumer.events"
)

func testTopology() pubsub.Topology {
	var t pubsub.Topology
	t.AddConsumer(subB, topicB)
	return t
}
