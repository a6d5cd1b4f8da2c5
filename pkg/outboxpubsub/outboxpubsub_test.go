package outboxpubsub_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/outboxpubsub"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

func newEvent(t *testing.T) outbox.Event {
	t.Helper()
	ev, err := outbox.NewEvent(context.Background(), "work_order", "wo-42", &testpb.OrderCompleted{
		EventId: "x", OrderId: "wo-42", Quantity: 3, CompletedItems: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	ev.Headers = map[string]string{
		"traceparent":    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":     "vendor=1",
		"correlation_id": "req-7",
	}
	ev.OccurredAt = time.Date(2026, 5, 6, 7, 8, 9, 10, time.UTC)
	return ev
}

func publisher(t *testing.T, emu *pubsubtest.Emulator, cfg pubsub.PublisherConfig) *pubsub.Publisher {
	t.Helper()
	pub, err := pubsub.NewPublisher(emu.Client, topicB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	return pub
}

func TestDispatchedEventArrivesWithOutboxIDAndAttributes(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, testTopology())
	d := outboxpubsub.New(publisher(t, emu, pubsub.PublisherConfig{}))
	ev := newEvent(t)
	commit, err := d.Dispatch(context.Background(), ev)
	if err != nil || commit != nil {
		t.Fatalf("dispatch: commit %v, err %v", commit, err)
	}

	sub, err := pubsub.NewSubscriber(emu.Client, subB, pubsub.SubscriberConfig{BatchConcurrency: 1},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		got []*pubsub.Received
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- sub.RunBatch(ctx, func(_ context.Context, ms []*pubsub.Received) []error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, ms...)
			return make([]error, len(ms))
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunBatch: %v", err)
		}
	})
	waitfor.Condition(t, 10*time.Second, "event received", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1 })

	m := got[0]
	want := map[string]string{
		pubsub.AttrEventID:       ev.ID.String(),
		pubsub.AttrEventType:     "lossless.pkgtest.v1.OrderCompleted",
		pubsub.AttrSchemaVersion: "1",
		pubsub.AttrOccurredAt:    "2026-05-06T07:08:09.00000001Z",
		pubsub.AttrContentType:   pubsub.ContentTypeProtobuf,
		pubsub.AttrTraceparent:   ev.Headers["traceparent"],
		pubsub.AttrTracestate:    "vendor=1",
		pubsub.AttrCorrelationID: "req-7",
	}
	for k, v := range want {
		if m.Attributes[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, m.Attributes[k], v)
		}
	}
	if m.OrderingKey != "wo-42" {
		t.Errorf("ordering key %q, want the aggregate id", m.OrderingKey)
	}
	var payload testpb.OrderCompleted
	if err := proto.Unmarshal(m.Data, &payload); err != nil || payload.GetOrderId() != "wo-42" {
		t.Fatalf("payload %v, err %v", &payload, err)
	}
}

func TestMissingTopicIsPermanent(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, pubsub.Topology{})
	d := outboxpubsub.New(publisher(t, emu, pubsub.PublisherConfig{}))
	_, err := d.Dispatch(context.Background(), newEvent(t))
	if !retry.IsPermanent(err) {
		t.Fatalf("want permanent, got %v", err)
	}
}

func TestUnavailablePubSubIsTransient(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, testTopology(), pstest.WithErrorInjection("Publish", codes.Unavailable, "injected outage"))
	// The client retries Unavailable until Timeout; keep the test short.
	d := outboxpubsub.New(publisher(t, emu, pubsub.PublisherConfig{Timeout: 300 * time.Millisecond}))
	_, err := d.Dispatch(context.Background(), newEvent(t))
	if err == nil || retry.IsPermanent(err) {
		t.Fatalf("want a transient error, got %v", err)
	}
	if n := len(emu.Server.Messages()); n != 0 {
		t.Fatalf("%d messages stored during the outage", n)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	type kind struct{ permanent, unavailable bool }
	for code, want := range map[codes.Code]kind{
		codes.InvalidArgument:   {permanent: true},
		codes.PermissionDenied:  {permanent: true},
		codes.NotFound:          {permanent: true},
		codes.Unavailable:       {unavailable: true},
		codes.DeadlineExceeded:  {unavailable: true},
		codes.ResourceExhausted: {},
		codes.Internal:          {},
	} {
		err := outboxpubsub.Classify(fmt.Errorf("wrapped: %w", status.Error(code, "x")))
		if got := (kind{retry.IsPermanent(err), outbox.IsUnavailable(err)}); got != want {
			t.Errorf("%s: %+v, want %+v", code, got, want)
		}
	}
	// The client's own retries end in the publisher's timeout.
	if err := outboxpubsub.Classify(context.DeadlineExceeded); retry.IsPermanent(err) || !outbox.IsUnavailable(err) {
		t.Errorf("publish timeout: permanent=%v unavailable=%v, want unavailable", retry.IsPermanent(err), outbox.IsUnavailable(err))
	}
	if outboxpubsub.Classify(nil) != nil {
		t.Error("nil error classified")
	}
}
