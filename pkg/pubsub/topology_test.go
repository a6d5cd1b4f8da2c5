package pubsub

import (
	"strings"
	"testing"
	"time"
)

func TestAddConsumer_DeclaresAValidConsumerWithDeadLetters(t *testing.T) {
	t.Parallel()
	var topo Topology
	topo.AddTopic("topic-a")
	topo.AddConsumer(SubscriptionID("svc", "topic-a"), "topic-a")
	topo.AddConsumer(SubscriptionID("other", "topic-a"), "topic-a")
	if err := topo.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(topo.Topics) != 3 || len(topo.Subscriptions) != 4 {
		t.Fatalf("want the topic once + 2 dead-letter topics and 2 consumer + 2 inspection subscriptions, got %d/%d",
			len(topo.Topics), len(topo.Subscriptions))
	}
	for _, s := range topo.Subscriptions {
		if strings.HasSuffix(s.ID, ".dead-letter-inspect") {
			if s.Topic != strings.TrimSuffix(s.ID, "-inspect") {
				t.Errorf("inspection subscription %s reads %s, want its dead-letter topic", s.ID, s.Topic)
			}
			continue
		}
		if s.DeadLetterTopic != DeadLetterTopicID(s.ID) || !s.EnableOrdering || s.RetryMinBackoff == 0 {
			t.Errorf("consumer subscription %s lacks dead-letter topic, ordering or retry policy: %+v", s.ID, s)
		}
	}
}

func TestTopologyValidateEnforcesRealPubSubLimits(t *testing.T) {
	t.Parallel()
	base := func() Subscription { return consumerSubscription("svc.topic-a", "topic-a", "svc.topic-a.dead-letter") }
	topics := []Topic{{ID: "topic-a"}, deadLetterTopic("svc.topic-a.dead-letter")}
	cases := map[string]func(*Subscription){
		"max delivery attempts below 5":  func(s *Subscription) { s.MaxDeliveryAttempts = 4 },
		"max delivery attempts over 100": func(s *Subscription) { s.MaxDeliveryAttempts = 101 },
		"ack deadline below 10s":         func(s *Subscription) { s.AckDeadline = 5 * time.Second },
		"ack deadline over 600s":         func(s *Subscription) { s.AckDeadline = 601 * time.Second },
		"retention below 10 min":         func(s *Subscription) { s.MessageRetention = time.Minute },
		"retention over 7 days":          func(s *Subscription) { s.MessageRetention = 8 * 24 * time.Hour },
		"retry max over 600s":            func(s *Subscription) { s.RetryMaxBackoff = 601 * time.Second },
		"retry min above max":            func(s *Subscription) { s.RetryMinBackoff = 2 * s.RetryMaxBackoff },
		"undeclared topic":               func(s *Subscription) { s.Topic = "nope-topic" },
		"undeclared dead-letter topic":   func(s *Subscription) { s.DeadLetterTopic = "nope-topic" },
		"id with a slash":                func(s *Subscription) { s.ID = "svc/topic" },
		"id starting with goog":          func(s *Subscription) { s.ID = "google-sub" },
	}
	ok := Topology{Topics: topics, Subscriptions: []Subscription{base()}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("base topology: %v", err)
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := base()
			mutate(&s)
			if err := (Topology{Topics: topics, Subscriptions: []Subscription{s}}).Validate(); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestConfigsValidate(t *testing.T) {
	t.Parallel()
	if err := (PublisherConfig{CountThreshold: 1001}).Validate(); err == nil {
		t.Error("publisher CountThreshold 1001 accepted")
	}
	if err := (SubscriberConfig{BatchSize: 1001}).Validate(); err == nil {
		t.Error("subscriber BatchSize 1001 accepted")
	}
	if err := (SubscriberConfig{BatchLeaseExtension: 5 * time.Second}).Validate(); err == nil {
		t.Error("subscriber BatchLeaseExtension 5s accepted")
	}
	if err := (ClientConfig{ProjectID: "p", EmulatorHost: "nohostport"}).Validate(); err == nil {
		t.Error("emulator host without port accepted")
	}
	if err := DefaultPublisherConfig().Validate(); err != nil {
		t.Error(err)
	}
	if err := DefaultSubscriberConfig().Validate(); err != nil {
		t.Error(err)
	}
}
