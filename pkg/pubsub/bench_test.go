package pubsub_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
)

// BenchmarkPublish is the publish-only ceiling of our Publisher against the
// pstest emulator over loopback gRPC, no database: the anchor B1p compares
// the outbox relay with (docs/performance.md). Each publish is awaited
// and has its own ordering key (one work order per event), as the relay's
// dispatches do; "in-flight" is how many publishes are awaited at once.
//
// Two topics, because pstest's cost depends on what is subscribed: every
// 10 ms each subscription scans all its unacked messages under the server's
// global lock, so a growing backlog slows publishing down (20k unacked on an
// ordered subscription: ~146 msg/s sequential instead of ~4k).
//   - no-subscription: a topic nothing reads; the pure publish path.
//   - drained: the system topology with RunBatch acking concurrently, as in
//     the running system; the consumer shares the CPU.
func BenchmarkPublish(b *testing.B) {
	for _, topic := range []string{"no-subscription", "drained"} {
		for _, inFlight := range []int{1, 16, 128} {
			b.Run(fmt.Sprintf("topic=%s/in-flight=%d", topic, inFlight), func(b *testing.B) {
				benchPublish(b, topic == "drained", inFlight)
			})
		}
	}
}

func benchPublish(b *testing.B, drained bool, inFlight int) {
	topicID := "bench-publish"
	topo := pubsub.Topology{Topics: []pubsub.Topic{{ID: topicID}}}
	if drained {
		topicID, topo = topicA, testTopology()
	}
	emu := pubsubtest.New(b, topo)
	pub, err := pubsub.NewPublisher(emu.Client, topicID, pubsub.PublisherConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Stop()
	if drained {
		sub, err := pubsub.NewSubscriber(emu.Client, subA, pubsub.SubscriberConfig{}, discard(), nil)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- sub.RunBatch(ctx, func(_ context.Context, ms []*pubsub.Received) []error { return make([]error, len(ms)) })
		}()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				b.Error(err)
			}
		}()
	}
	var seq atomic.Int64
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range inFlight {
		wg.Go(func() {
			for n := seq.Add(1); n <= int64(b.N); n = seq.Add(1) {
				id := strconv.FormatInt(n, 10)
				if _, err := pub.Publish(ctx, pubsub.Message{EventID: "ev-" + id, OrderingKey: "wo-" + id, Event: completed("wo-"+id, "ev-"+id)}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
}

// BenchmarkRunBatchReceive measures RunBatch draining a backlog (pull →
// no-op batch handler → acknowledge) from the pstest emulator: the
// receive-side ceiling for inbox ingest (B4) without a database.
func BenchmarkRunBatchReceive(b *testing.B) {
	emu := pubsubtest.New(b, testTopology())
	pub, err := pubsub.NewPublisher(emu.Client, topicA, pubsub.PublisherConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Stop()
	var wg sync.WaitGroup
	var seq atomic.Int64
	for range 64 {
		wg.Go(func() {
			for n := seq.Add(1); n <= int64(b.N); n = seq.Add(1) {
				id := strconv.FormatInt(n, 10)
				if _, err := pub.Publish(context.Background(), pubsub.Message{EventID: "ev-" + id, OrderingKey: "wo-" + id, Event: completed("wo-"+id, "ev-"+id)}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()

	sub, err := pubsub.NewSubscriber(emu.Client, subA, pubsub.SubscriberConfig{}, discard(), nil)
	if err != nil {
		b.Fatal(err)
	}
	var received atomic.Int64
	all := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ResetTimer()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- sub.RunBatch(ctx, func(_ context.Context, ms []*pubsub.Received) []error {
			if received.Add(int64(len(ms))) >= int64(b.N) {
				select {
				case <-all:
				default:
					close(all)
				}
			}
			return make([]error, len(ms))
		})
	}()
	<-all
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
