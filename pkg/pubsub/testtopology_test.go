package pubsub_test

import "github.com/lossless-dev/lossless/pkg/pubsub"

// The tests' own topology: two topics, each with one consumer (built as a
// system declares its consumers, with dead-letter topic and inspection
// subscription).
const (
	topicA = "topic-a"
	topicB = "topic-b"
	subA   = "consumer.topic-a"
	subB   = "consumer.topic-b"

	topicADeadLetter = subA + ".dead-letter"
	topicBDeadLetter = subB + ".dead-letter"
	subADeadLetter   = subA + ".dead-letter-inspect"
	subBDeadLetter   = subB + ".dead-letter-inspect"
)

func testTopology() pubsub.Topology {
	var t pubsub.Topology
	t.AddConsumer(pubsub.SubscriptionID("consumer", topicA), topicA)
	t.AddConsumer(pubsub.SubscriptionID("consumer", topicB), topicB)
	return t
}
