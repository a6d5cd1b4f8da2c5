package pubsub_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

const wait = 10 * time.Second

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// bundle is one test's emulator, publisher on work-order-completed and a
// subscriber on its consumer subscription.
type bundle struct {
	emu *pubsubtest.Emulator
	pub *pubsub.Publisher
	sub *pubsub.Subscriber
}

func setup(t *testing.T, topo pubsub.Topology, opts ...pstest.ServerReactorOption) bundle {
	t.Helper()
	emu := pubsubtest.New(t, topo, opts...)
	pub, err := pubsub.NewPublisher(emu.Client, topicA, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	sub, err := pubsub.NewSubscriber(emu.Client, subA, pubsub.SubscriberConfig{}, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return bundle{emu: emu, pub: pub, sub: sub}
}

// run starts fn in the background and stops it (and checks its error) at cleanup.
func run(t *testing.T, fn func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("receiver returned %v", err)
		}
	})
}

func completed(orderID, eventID string) *testpb.OrderCompleted {
	return &testpb.OrderCompleted{EventId: eventID, OrderId: orderID, CompletedItems: 3,
		CompletedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC))}
}

func publish(t *testing.T, p *pubsub.Publisher, orderID, eventID string) {
	t.Helper()
	if _, err := p.Publish(context.Background(), pubsub.Message{EventID: eventID, OrderingKey: orderID, Event: completed(orderID, eventID)}); err != nil {
		t.Fatal(err)
	}
}

// deliveries records handled messages by event id.
type deliveries struct {
	mu   sync.Mutex
	seen map[string][]*pubsub.Received
}

func (d *deliveries) add(m *pubsub.Received) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[string][]*pubsub.Received{}
	}
	id := m.Attributes[pubsub.AttrEventID]
	d.seen[id] = append(d.seen[id], m)
	return len(d.seen[id])
}

func (d *deliveries) of(eventID string) []*pubsub.Received {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.seen[eventID])
}

func TestProvisionCreatesTopologyAndSecondRunChangesNothing(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, pubsub.Topology{}) // empty project
	ctx := context.Background()
	want := testTopology()

	changes, err := pubsub.Provision(ctx, emu.Client, want)
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != len(want.Topics)+len(want.Subscriptions) {
		t.Fatalf("first run: want one creation per resource, got %q", changes)
	}

	var topics []string
	for tp, err := range emu.Client.TopicAdminClient.ListTopics(ctx, &pubsubpb.ListTopicsRequest{Project: "projects/" + emu.ProjectID}).All() {
		if err != nil {
			t.Fatal(err)
		}
		topics = append(topics, tp.GetName())
	}
	for _, tp := range want.Topics {
		if !slices.Contains(topics, pubsub.TopicName(emu.ProjectID, tp.ID)) {
			t.Errorf("topic %s not listed in %q", tp.ID, topics)
		}
	}
	dl, err := emu.Client.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: pubsub.TopicName(emu.ProjectID, topicADeadLetter)})
	if err != nil {
		t.Fatal(err)
	}
	if got := dl.GetMessageRetentionDuration().AsDuration(); got != pubsub.MaxTopicMessageRetention {
		t.Errorf("dead-letter topic retention %v, want %v", got, pubsub.MaxTopicMessageRetention)
	}
	for _, s := range want.Subscriptions {
		got, err := emu.Client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: pubsub.SubscriptionName(emu.ProjectID, s.ID)})
		if err != nil {
			t.Fatalf("subscription %s: %v", s.ID, err)
		}
		if got.GetTopic() != pubsub.TopicName(emu.ProjectID, s.Topic) ||
			time.Duration(got.GetAckDeadlineSeconds())*time.Second != s.AckDeadline ||
			got.GetMessageRetentionDuration().AsDuration() != s.MessageRetention ||
			got.GetEnableMessageOrdering() != s.EnableOrdering ||
			got.GetExpirationPolicy() == nil || got.GetExpirationPolicy().GetTtl() != nil {
			t.Errorf("subscription %s: got %v, declared %+v", s.ID, got, s)
		}
		if s.DeadLetterTopic != "" {
			if got.GetDeadLetterPolicy().GetDeadLetterTopic() != pubsub.TopicName(emu.ProjectID, s.DeadLetterTopic) ||
				int(got.GetDeadLetterPolicy().GetMaxDeliveryAttempts()) != s.MaxDeliveryAttempts ||
				got.GetRetryPolicy().GetMinimumBackoff().AsDuration() != s.RetryMinBackoff ||
				got.GetRetryPolicy().GetMaximumBackoff().AsDuration() != s.RetryMaxBackoff {
				t.Errorf("subscription %s: dead-letter/retry policy %v / %v, declared %+v", s.ID, got.GetDeadLetterPolicy(), got.GetRetryPolicy(), s)
			}
		}
	}

	changes, err = pubsub.Provision(ctx, emu.Client, want)
	if err != nil || len(changes) != 0 {
		t.Fatalf("second run: changes %q, err %v; want none", changes, err)
	}
}

// TestProvisionLeavesWhatTheServerCannotUpdate: Google's Cloud SDK emulator
// (compose's) implements no UpdateTopic and does not echo every field, so a
// topic it holds can read back as drifted. Provisioning must report that
// drift and go on, not abort: a second `docker compose up` against a running
// emulator provisions again. The same holds for UpdateSubscription.
func TestProvisionLeavesWhatTheServerCannotUpdate(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, pubsub.Topology{},
		pstest.WithErrorInjection("UpdateTopic", codes.Unimplemented, "UpdateTopic is not implemented"),
		pstest.WithErrorInjection("UpdateSubscription", codes.Unimplemented, "UpdateSubscription is not implemented"))
	ctx := context.Background()
	topo := testTopology()
	// As the emulator reads them back: a dead-letter topic without its
	// retention, a subscription with another ack deadline.
	if _, err := emu.Client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: pubsub.TopicName(emu.ProjectID, topicADeadLetter)}); err != nil {
		t.Fatal(err)
	}
	if _, err := emu.Client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: pubsub.TopicName(emu.ProjectID, topicB)}); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(topo.Subscriptions, func(s pubsub.Subscription) bool { return s.ID == subB })
	if _, err := emu.Client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: pubsub.SubscriptionName(emu.ProjectID, subB), Topic: pubsub.TopicName(emu.ProjectID, topicB),
		EnableMessageOrdering: topo.Subscriptions[i].EnableOrdering, AckDeadlineSeconds: 10,
	}); err != nil {
		t.Fatal(err)
	}

	wantKept := []string{
		"left as is: topic " + topicADeadLetter + ": message_retention_duration 0s -> " + pubsub.MaxTopicMessageRetention.String() + " (UpdateTopic unimplemented)",
		"left as is: subscription " + subB + ": [ack_deadline_seconds dead_letter_policy expiration_policy retry_policy] (UpdateSubscription unimplemented)",
	}
	for run := 1; run <= 2; run++ {
		changes, err := pubsub.Provision(ctx, emu.Client, topo)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		var kept []string
		for _, ch := range changes {
			if strings.HasPrefix(ch, "left as is: ") {
				kept = append(kept, ch)
			}
		}
		if !slices.Equal(kept, wantKept) {
			t.Errorf("run %d: drift reported %q, want %q", run, kept, wantKept)
		}
		if run == 2 && len(changes) != len(wantKept) {
			t.Errorf("run 2: changes %q, want only the drift left as is", changes)
		}
	}
	// Everything missing was created all the same.
	for _, s := range topo.Subscriptions {
		if _, err := emu.Client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: pubsub.SubscriptionName(emu.ProjectID, s.ID)}); err != nil {
			t.Errorf("subscription %s: %v", s.ID, err)
		}
	}
}

func TestProvisionRepairsDriftAndRefusesImmutableChanges(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, testTopology())
	ctx := context.Background()
	name := pubsub.SubscriptionName(emu.ProjectID, subB)
	// Someone shortened the ack deadline and removed the retry policy by hand.
	_, err := emu.Client.SubscriptionAdminClient.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{
		Subscription: &pubsubpb.Subscription{Name: name, AckDeadlineSeconds: 10, MessageRetentionDuration: durationpb.New(time.Hour)},
		UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"ack_deadline_seconds", "retry_policy", "message_retention_duration"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	changes, err := pubsub.Provision(ctx, emu.Client, testTopology())
	if err != nil || len(changes) != 1 {
		t.Fatalf("want one update, got %q, %v", changes, err)
	}
	got, err := emu.Client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: name})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetAckDeadlineSeconds() != 20 || got.GetRetryPolicy() == nil || got.GetMessageRetentionDuration().AsDuration() != pubsub.MaxSubscriptionMessageRetention {
		t.Fatalf("drift not repaired: %v", got)
	}

	// Ordering cannot change in place: provisioning must refuse, not delete.
	topo := testTopology()
	for i := range topo.Subscriptions {
		if topo.Subscriptions[i].ID == subB {
			topo.Subscriptions[i].EnableOrdering = false
		}
	}
	if _, err := pubsub.Provision(ctx, emu.Client, topo); err == nil {
		t.Fatal("ordering change accepted")
	}
}

func TestPublishReceiveCarriesAttributesAndOrderingKey(t *testing.T) {
	t.Parallel()
	b := setup(t, testTopology())
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled,
	}))
	occurred := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.FixedZone("CET", 3600))
	event := completed("wo-1", "ev-1")
	id, err := b.pub.Publish(ctx, pubsub.Message{
		EventID: "ev-1", OrderingKey: "wo-1", Event: event, OccurredAt: occurred,
		Attributes: map[string]string{pubsub.AttrCorrelationID: "req-9", pubsub.AttrEventID: "spoofed"},
	})
	if err != nil || id == "" {
		t.Fatalf("publish: id %q, err %v", id, err)
	}

	var d deliveries
	run(t, func(ctx context.Context) error {
		return b.sub.Run(ctx, func(_ context.Context, m *pubsub.Received) error { d.add(m); return nil })
	})
	waitfor.Condition(t, wait, "message received", func() bool { return len(d.of("ev-1")) == 1 })
	m := d.of("ev-1")[0]

	wantAttrs := map[string]string{
		pubsub.AttrEventID:       "ev-1",
		pubsub.AttrEventType:     "lossless.pkgtest.v1.OrderCompleted",
		pubsub.AttrSchemaVersion: "1",
		pubsub.AttrOccurredAt:    "2026-03-04T04:06:07.123456789Z",
		pubsub.AttrContentType:   pubsub.ContentTypeProtobuf,
		pubsub.AttrTraceparent:   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		pubsub.AttrCorrelationID: "req-9",
	}
	for k, v := range wantAttrs {
		if m.Attributes[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, m.Attributes[k], v)
		}
	}
	if m.OrderingKey != "wo-1" || m.ID != id || m.DeliveryAttempt != 1 {
		t.Errorf("ordering key %q, id %q (published %q), delivery attempt %d", m.OrderingKey, m.ID, id, m.DeliveryAttempt)
	}
	var got testpb.OrderCompleted
	if err := proto.Unmarshal(m.Data, &got); err != nil || !proto.Equal(&got, event) {
		t.Fatalf("payload %v (err %v), want %v", &got, err, event)
	}
}

func TestHandlerErrorNacksAndMessageIsRedelivered(t *testing.T) {
	t.Parallel()
	b := setup(t, testTopology())
	publish(t, b.pub, "wo-1", "ev-1")

	var d deliveries
	run(t, func(ctx context.Context) error {
		return b.sub.Run(ctx, func(_ context.Context, m *pubsub.Received) error {
			if d.add(m) < 3 {
				return errors.New("database unavailable") // technical failure: nack
			}
			return nil
		})
	})
	waitfor.Condition(t, wait, "handled a third time", func() bool { return len(d.of("ev-1")) >= 3 })
	for i, m := range d.of("ev-1")[:3] {
		if m.DeliveryAttempt != i+1 {
			t.Errorf("handling %d saw delivery attempt %d", i+1, m.DeliveryAttempt)
		}
	}
	waitfor.Condition(t, wait, "acked once after success", func() bool { return acks(b.emu, "ev-1") == 1 })
}

func TestPanicInHandlerIsANack(t *testing.T) {
	t.Parallel()
	b := setup(t, testTopology())
	publish(t, b.pub, "wo-1", "ev-1")
	var d deliveries
	run(t, func(ctx context.Context) error {
		return b.sub.Run(ctx, func(_ context.Context, m *pubsub.Received) error {
			if d.add(m) == 1 {
				panic("bug in handler")
			}
			return nil
		})
	})
	waitfor.Condition(t, wait, "redelivered after the panic", func() bool { return len(d.of("ev-1")) >= 2 })
	waitfor.Condition(t, wait, "acked after success", func() bool { return acks(b.emu, "ev-1") == 1 })
}

// withMaxAttempts returns the system topology with the work-order-completed
// consumer dead-lettering after n deliveries.
func withMaxAttempts(n int) pubsub.Topology {
	topo := testTopology()
	for i := range topo.Subscriptions {
		if topo.Subscriptions[i].ID == subA {
			topo.Subscriptions[i].MaxDeliveryAttempts = n
		}
	}
	return topo
}

func TestMessageNackedPastMaxDeliveryAttemptsArrivesOnDeadLetterSubscription(t *testing.T) {
	t.Parallel()
	b := setup(t, withMaxAttempts(pubsub.MinMaxDeliveryAttempts))
	publish(t, b.pub, "wo-1", "ev-poison")

	var d deliveries
	run(t, func(ctx context.Context) error {
		return b.sub.Run(ctx, func(_ context.Context, m *pubsub.Received) error {
			d.add(m)
			return errors.New("always fails")
		})
	})
	dlq, err := pubsub.NewSubscriber(b.emu.Client, subADeadLetter, pubsub.SubscriberConfig{BatchConcurrency: 1}, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var dead deliveries
	run(t, func(ctx context.Context) error {
		return dlq.RunBatch(ctx, func(_ context.Context, ms []*pubsub.Received) []error {
			for _, m := range ms {
				dead.add(m)
			}
			return make([]error, len(ms))
		})
	})
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range b.emu.Server.Messages() {
				t.Logf("pstest message %s topic %s deliveries %d acks %d modacks %+v", m.ID, m.Topic, m.Deliveries, m.Acks, m.Modacks)
			}
			t.Logf("handled %d times", len(d.of("ev-poison")))
		}
	})
	// At least once, not exactly once: pstest forwards the dead letter again on
	// every 10 ms tick until its next tick finds the original gone, because its
	// forwarding ack is ignored after a nack cleared the ack id (ADR 0004);
	// real Pub/Sub's forwarding is best-effort too. Replay is idempotent.
	waitfor.Condition(t, wait, "dead letter arrives", func() bool { return len(dead.of("ev-poison")) >= 1 })
	t.Logf("dead letter copies received so far: %d", len(dead.of("ev-poison")))
	if n := len(d.of("ev-poison")); n != pubsub.MinMaxDeliveryAttempts {
		t.Errorf("handled %d times before dead-lettering, want %d", n, pubsub.MinMaxDeliveryAttempts)
	}
	m := dead.of("ev-poison")[0]
	var got testpb.OrderCompleted
	if err := proto.Unmarshal(m.Data, &got); err != nil || got.GetEventId() != "ev-poison" {
		t.Fatalf("dead letter payload %v, err %v", &got, err)
	}
	if m.Attributes[pubsub.AttrEventType] != "lossless.pkgtest.v1.OrderCompleted" || m.OrderingKey != "wo-1" {
		t.Errorf("dead letter lost attributes or key: %v %q", m.Attributes, m.OrderingKey)
	}
}

func TestRunBatchAcksOnlyTheSuccessfulMessages(t *testing.T) {
	t.Parallel()
	b := setup(t, testTopology())
	events := []string{"ev-0", "ev-1", "ev-2", "ev-3", "ev-4", "ev-5"}
	for i, ev := range events {
		publish(t, b.pub, "wo-"+ev, events[i])
	}
	failFirst := map[string]bool{"ev-1": true, "ev-4": true}
	var d deliveries
	run(t, func(ctx context.Context) error {
		return b.sub.RunBatch(ctx, func(_ context.Context, ms []*pubsub.Received) []error {
			errs := make([]error, len(ms))
			for i, m := range ms {
				if d.add(m) == 1 && failFirst[m.Attributes[pubsub.AttrEventID]] {
					errs[i] = errors.New("insert failed")
				}
			}
			return errs
		})
	})
	waitfor.Condition(t, wait, "every message acked", func() bool {
		for _, ev := range events {
			if acks(b.emu, ev) != 1 {
				return false
			}
		}
		return true
	})
	for _, ev := range events {
		want := 1
		if failFirst[ev] {
			want = 2
		}
		if got := deliveriesOf(b.emu, ev); got != want {
			t.Errorf("%s delivered %d times, want %d", ev, got, want)
		}
	}
}

func TestRunBatchPanicNacksTheWholeBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, testTopology())
	publish(t, b.pub, "wo-1", "ev-1")
	var d deliveries
	run(t, func(ctx context.Context) error {
		return b.sub.RunBatch(ctx, func(_ context.Context, ms []*pubsub.Received) []error {
			for _, m := range ms {
				if d.add(m) == 1 {
					panic("bug in batch handler")
				}
			}
			return make([]error, len(ms))
		})
	})
	waitfor.Condition(t, wait, "acked after redelivery", func() bool { return acks(b.emu, "ev-1") == 1 })
	if got := deliveriesOf(b.emu, "ev-1"); got != 2 {
		t.Errorf("delivered %d times, want 2", got)
	}
}

func TestRunBatchStopsOnMissingSubscription(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, testTopology())
	sub, err := pubsub.NewSubscriber(emu.Client, "no-such-subscription", pubsub.SubscriberConfig{}, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = sub.RunBatch(context.Background(), func(context.Context, []*pubsub.Received) []error { return nil })
	if status.Code(errors.Unwrap(err)) != codes.NotFound {
		t.Fatalf("want NotFound, got %v", err)
	}
}

func TestPublishErrorIsReturnedAndKeyResumes(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, pubsub.Topology{})
	pub, err := pubsub.NewPublisher(emu.Client, topicA, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	msg := pubsub.Message{EventID: "ev-1", OrderingKey: "wo-1", Event: completed("wo-1", "ev-1")}
	if _, err := pub.Publish(context.Background(), msg); status.Code(err) != codes.NotFound {
		t.Fatalf("publish to a missing topic: want NotFound, got %v", err)
	}
	// The failure paused key wo-1 in the client; once the topic exists the
	// retry of the same key must go through.
	if _, err := pubsub.Provision(context.Background(), emu.Client, testTopology()); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(context.Background(), msg); err != nil {
		t.Fatalf("retry after the topic exists: %v", err)
	}
}

func TestPublishInjectedErrorIsReturned(t *testing.T) {
	t.Parallel()
	b := setup(t, testTopology(), pstest.WithErrorInjection("Publish", codes.PermissionDenied, "injected"))
	_, err := b.pub.Publish(context.Background(), pubsub.Message{EventID: "ev-1", OrderingKey: "wo-1", Event: completed("wo-1", "ev-1")})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("want PermissionDenied, got %v", err)
	}
	if n := len(b.emu.Server.Messages()); n != 0 {
		t.Fatalf("%d messages stored", n)
	}
}

func acks(emu *pubsubtest.Emulator, eventID string) int {
	if m := find(emu, eventID); m != nil {
		return m.Acks
	}
	return -1
}

func deliveriesOf(emu *pubsubtest.Emulator, eventID string) int {
	if m := find(emu, eventID); m != nil {
		return m.Deliveries
	}
	return -1
}

func find(emu *pubsubtest.Emulator, eventID string) *pstest.Message {
	for _, m := range emu.Server.Messages() {
		if m.Attributes[pubsub.AttrEventID] == eventID && m.Topic == pubsub.TopicName(emu.ProjectID, topicA) {
			return m
		}
	}
	return nil
}

// TestF15_RunBatchOutageDoesNotBurnDeliveryAttempts: while the database is
// down every message of a batch fails. RunBatch must back off instead of
// re-pulling at once, or (on an emulator that ignores the retry policy) the
// message would be dead-lettered within a second of the outage. After the
// outage the message is handled and acked on its own subscription.
func TestF15_RunBatchOutageDoesNotBurnDeliveryAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, testTopology())
	publish(t, b.pub, "wo-1", "ev-1")
	outageUntil := time.Now().Add(time.Second)
	var d deliveries
	run(t, func(ctx context.Context) error {
		return b.sub.RunBatch(ctx, func(_ context.Context, ms []*pubsub.Received) []error {
			errs := make([]error, len(ms))
			for i, m := range ms {
				d.add(m)
				if time.Now().Before(outageUntil) {
					errs[i] = errors.New("database unavailable")
				}
			}
			return errs
		})
	})
	waitfor.Condition(t, wait, "acked after the outage", func() bool { return acks(b.emu, "ev-1") == 1 })
	if n := len(d.of("ev-1")); n >= pubsub.MaxMaxDeliveryAttempts/4 {
		t.Fatalf("%d deliveries during a 1 s outage: the outage burns delivery attempts", n)
	}
}
