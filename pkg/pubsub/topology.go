package pubsub

import (
	"errors"
	"fmt"
	"time"
)

// Naming rules of a topology built with AddConsumer. A subscription id is
// "<consumer service>.<topic>", so a listing shows who reads what. Each
// consumer subscription has its own dead-letter topic
// ("<subscription>.dead-letter") and an inspection subscription on it
// ("<subscription>.dead-letter-inspect") from which operators read and replay
// dead letters through the normal publish path.

// SubscriptionID is the id of consumer's subscription to topic.
func SubscriptionID(consumer, topic string) string { return consumer + "." + topic }

// DeadLetterTopicID is the dead-letter topic of subscription sub.
func DeadLetterTopicID(sub string) string { return sub + ".dead-letter" }

// DeadLetterInspectionID is the inspection subscription on sub's dead-letter topic.
func DeadLetterInspectionID(sub string) string { return sub + ".dead-letter-inspect" }

// Limits enforced by real Pub/Sub (cloud.google.com/pubsub/docs/subscription-properties,
// /handling-failures, /lease-management). The emulators check only some of
// them (ADR 0004), so Topology.Validate checks all of them before anything is
// sent: a topology that provisions locally also provisions on GCP.
const (
	MinAckDeadline                  = 10 * time.Second
	MaxAckDeadline                  = 600 * time.Second
	MinMessageRetention             = 10 * time.Minute
	MaxSubscriptionMessageRetention = 7 * 24 * time.Hour
	// MaxTopicMessageRetention: with topic retention set, messages stay
	// readable (seek) up to 31 days, acknowledged or not; Pub/Sub's
	// documented retention range, 10 min to 31 days, ends at this limit.
	MaxTopicMessageRetention = 31 * 24 * time.Hour
	MaxRetryBackoff          = 600 * time.Second
	MinMaxDeliveryAttempts   = 5
	MaxMaxDeliveryAttempts   = 100
)

// Topology is the declared set of topics and subscriptions; Provision makes
// a project match it.
type Topology struct {
	Topics        []Topic
	Subscriptions []Subscription
}

// Topic is one topic.
type Topic struct {
	ID string
	// MessageRetention keeps published messages on the topic itself (0 = off),
	// readable by seek even after acknowledgement.
	MessageRetention time.Duration
}

// Subscription is one pull subscription with its delivery policy.
type Subscription struct {
	ID    string
	Topic string
	// AckDeadline: a message not acked or nacked within it is redelivered.
	// The Go client extends it while a handler runs (lease management).
	AckDeadline time.Duration
	// MessageRetention: how long an unacknowledged message is kept.
	MessageRetention time.Duration
	// RetryMinBackoff and RetryMaxBackoff form the retry policy: exponential
	// backoff between redeliveries after a nack or ack-deadline expiry. Both
	// zero means no retry policy (immediate redelivery).
	RetryMinBackoff time.Duration
	RetryMaxBackoff time.Duration
	// DeadLetterTopic receives a message after MaxDeliveryAttempts deliveries
	// ("" = no dead-lettering). Enables Received.DeliveryAttempt.
	DeadLetterTopic     string
	MaxDeliveryAttempts int
	// EnableOrdering delivers messages of one ordering key in publish order,
	// one outstanding batch per key. Immutable after creation.
	EnableOrdering bool
}

// AddTopic declares an event topic; declaring one twice is a no-op. Event
// topics keep no messages of their own: the consumer's inbox is the durable
// record once acked, and the subscription keeps what is not yet acked. Topic
// retention would only add seek-after-ack, which the inbox's SQL repair
// replaces.
func (t *Topology) AddTopic(id string) {
	for _, tp := range t.Topics {
		if tp.ID == id {
			return
		}
	}
	t.Topics = append(t.Topics, Topic{ID: id})
}

// AddConsumer declares subscription sub on topic (declaring the topic too)
// with the consumer delivery policy, its dead-letter topic and its
// inspection subscription. Every consumer gets the same policy because every
// consumer built on these packages follows the same rule: before the ack it
// only does a durable insert into its own database (inbox, idempotent
// consumer), which can fail only technically.
func (t *Topology) AddConsumer(sub, topic string) {
	t.AddTopic(topic)
	dl := DeadLetterTopicID(sub)
	t.Topics = append(t.Topics, deadLetterTopic(dl))
	t.Subscriptions = append(t.Subscriptions,
		consumerSubscription(sub, topic, dl),
		deadLetterSubscription(DeadLetterInspectionID(sub), dl),
	)
}

func consumerSubscription(id, topic, dlTopic string) Subscription {
	return Subscription{
		ID:    id,
		Topic: topic,
		// 20 s: the pre-ack work is one batched insert (milliseconds), and
		// RunBatch extends the lease every 5 s while a handler runs, so this
		// only bounds how long a crashed consumer holds a message before
		// redelivery (F10): with 60 s the orders whose completion a killed
		// workorder replica had pulled were the chaos test's p99. The minimum
		// 10 s would leave one missed renewal (a stalled process) before a
		// redelivery; 20 s leaves three.
		AckDeadline: 20 * time.Second,
		// 7 days, the maximum without topic retention: the time operators
		// have to bring a dead consumer back before Pub/Sub drops unacked
		// messages (retention is the final expiry, acked or not).
		MessageRetention: MaxSubscriptionMessageRetention,
		// Nacks only come from technical failures (database down, F15). 1 s
		// to 60 s spreads redeliveries so a recovering database is not
		// hammered by a tight nack loop, and keeps the worst extra delay after
		// recovery at a minute. (Pub/Sub defaults: 10 s / 600 s.)
		RetryMinBackoff: time.Second,
		RetryMaxBackoff: 60 * time.Second,
		// 100, the maximum: business rejections never nack (they are parked
		// in the inbox), so every nack is technical and should survive the
		// longest outage Pub/Sub allows: with backoff capped at 60 s, 100
		// attempts span about an hour and a half of a failing database before
		// a message moves to the dead-letter topic, where it is still kept.
		DeadLetterTopic:     dlTopic,
		MaxDeliveryAttempts: MaxMaxDeliveryAttempts,
		// Ordering key = the aggregate id (pkg/outboxpubsub): events of one
		// aggregate arrive in publish order, which an inbox keeps per key.
		EnableOrdering: true,
	}
}

func deadLetterTopic(id string) Topic {
	// 31 days of topic retention, the maximum: a dead letter is evidence of
	// an incident; keep it as long as Pub/Sub can, even after an operator
	// acked it on the inspection subscription.
	return Topic{ID: id, MessageRetention: MaxTopicMessageRetention}
}

func deadLetterSubscription(id, topic string) Subscription {
	return Subscription{
		ID:    id,
		Topic: topic,
		// 600 s, the maximum: an operator (or the replay tool) reads one
		// dead letter and decides; a redelivery in the middle of that would
		// only confuse.
		AckDeadline:      MaxAckDeadline,
		MessageRetention: MaxSubscriptionMessageRetention,
		// No retry policy, no dead-letter policy of its own (a dead letter of
		// a dead letter helps nobody), no ordering: dead letters are looked
		// at one by one, and replay re-publishes with the original ordering key.
	}
}

// Validate checks the topology against real Pub/Sub's limits and internal
// references, so a mistake fails before any request.
func (t Topology) Validate() error {
	var errs []error
	topics := map[string]bool{}
	for _, tp := range t.Topics {
		if err := validateID(tp.ID); err != nil {
			errs = append(errs, fmt.Errorf("topic %q: %w", tp.ID, err))
		}
		if topics[tp.ID] {
			errs = append(errs, fmt.Errorf("topic %q declared twice", tp.ID))
		}
		topics[tp.ID] = true
		if r := tp.MessageRetention; r != 0 && (r < MinMessageRetention || r > MaxTopicMessageRetention) {
			errs = append(errs, fmt.Errorf("topic %q: message retention %v outside [%v, %v]", tp.ID, r, MinMessageRetention, MaxTopicMessageRetention))
		}
	}
	subs := map[string]bool{}
	for _, s := range t.Subscriptions {
		if err := s.validate(topics); err != nil {
			errs = append(errs, fmt.Errorf("subscription %q: %w", s.ID, err))
		}
		if subs[s.ID] {
			errs = append(errs, fmt.Errorf("subscription %q declared twice", s.ID))
		}
		subs[s.ID] = true
	}
	return errors.Join(errs...)
}

func (s Subscription) validate(topics map[string]bool) error {
	var errs []error
	if err := validateID(s.ID); err != nil {
		errs = append(errs, err)
	}
	if !topics[s.Topic] {
		errs = append(errs, fmt.Errorf("topic %q is not declared", s.Topic))
	}
	if s.AckDeadline < MinAckDeadline || s.AckDeadline > MaxAckDeadline || s.AckDeadline%time.Second != 0 {
		errs = append(errs, fmt.Errorf("ack deadline %v: want whole seconds in [%v, %v]", s.AckDeadline, MinAckDeadline, MaxAckDeadline))
	}
	if s.MessageRetention < MinMessageRetention || s.MessageRetention > MaxSubscriptionMessageRetention {
		errs = append(errs, fmt.Errorf("message retention %v outside [%v, %v]", s.MessageRetention, MinMessageRetention, MaxSubscriptionMessageRetention))
	}
	if s.RetryMinBackoff != 0 || s.RetryMaxBackoff != 0 {
		if s.RetryMinBackoff < 0 || s.RetryMaxBackoff > MaxRetryBackoff || s.RetryMinBackoff > s.RetryMaxBackoff {
			errs = append(errs, fmt.Errorf("retry backoff [%v, %v]: want 0 <= min <= max <= %v", s.RetryMinBackoff, s.RetryMaxBackoff, MaxRetryBackoff))
		}
	}
	if s.DeadLetterTopic != "" {
		if !topics[s.DeadLetterTopic] {
			errs = append(errs, fmt.Errorf("dead-letter topic %q is not declared", s.DeadLetterTopic))
		}
		if s.DeadLetterTopic == s.Topic {
			errs = append(errs, errors.New("dead-letter topic must differ from the subscription's topic"))
		}
		// Real Pub/Sub rejects values outside 5..100; pstest accepts any.
		if s.MaxDeliveryAttempts < MinMaxDeliveryAttempts || s.MaxDeliveryAttempts > MaxMaxDeliveryAttempts {
			errs = append(errs, fmt.Errorf("max delivery attempts %d outside [%d, %d]", s.MaxDeliveryAttempts, MinMaxDeliveryAttempts, MaxMaxDeliveryAttempts))
		}
	} else if s.MaxDeliveryAttempts != 0 {
		errs = append(errs, errors.New("max delivery attempts set without a dead-letter topic"))
	}
	return errors.Join(errs...)
}

// validateID applies Pub/Sub's resource-id rule: 3-255 characters, starting
// with a letter, from [A-Za-z0-9-_.~+%], not starting with "goog".
func validateID(id string) error {
	if len(id) < 3 || len(id) > 255 {
		return fmt.Errorf("id %q: want 3 to 255 characters", id)
	}
	if c := id[0]; (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') {
		return fmt.Errorf("id %q: must start with a letter", id)
	}
	if len(id) >= 4 && id[:4] == "goog" {
		return fmt.Errorf("id %q: must not start with \"goog\"", id)
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.' || c == '~' || c == '+' || c == '%'
		if !ok {
			return fmt.Errorf("id %q: character %q not allowed", id, c)
		}
	}
	return nil
}
