package pubsub_test

import (
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// N5: the path to Pub/Sub goes dead under the publisher's open connection
// (half-open: no RST ever comes). A publish fails within the publisher's
// Timeout, even when the caller's context has no deadline, and the key it
// used publishes again once the path heals.
func TestStalledConnection_PublishFailsWithinItsTimeout(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, testTopology())
	proxy := pgtest.NewStallProxy(t, emu.Addr)
	ctx := context.Background()
	c, err := pubsub.NewClient(ctx, pubsub.ClientConfig{ProjectID: pubsubtest.ProjectID, EmulatorHost: proxy.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	const timeout = 2 * time.Second
	pub, err := pubsub.NewPublisher(c, topicA, pubsub.PublisherConfig{Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	if _, err := pub.PublishRaw(ctx, []byte("before"), nil, "order-1"); err != nil {
		t.Fatal(err)
	}

	proxy.Stall()
	start := time.Now()
	_, err = pub.PublishRaw(ctx, []byte("during"), nil, "order-1")
	elapsed := time.Since(start)
	if err == nil {
		t.Fatal("a publish through a dead connection succeeded")
	}
	if elapsed > timeout+3*time.Second {
		t.Errorf("publish on a dead connection failed after %v, want within its %v Timeout", elapsed, timeout)
	}

	proxy.Heal()
	waitfor.Condition(t, 20*time.Second, "the key publishes again after heal", func() bool {
		_, err := pub.PublishRaw(ctx, []byte("after"), nil, "order-1")
		return err == nil
	})
}

// N5, the subscriber's side: the connection a subscriber receives through
// goes dead under it (half-open, no RST), while a new connection gets
// through (pgtest.StallProxy.StallOpen). The liveness probe must find it
// dead and abandon it (with the probe's 0.5 s + 0.5 s, about 1 s plus a
// dial; without it a stream waits ~45 s and a pull 60 s), a message
// published afterwards must arrive through a fresh connection (within
// 30 s: far more than the bound, for loaded machines), and one
// published while the connection was dead, possibly sent into it and lost
// there, must arrive too, redelivered after its ack deadline: the
// subscription's (10 s here) for RunBatch's pulls, the stream's for Run (60
// s, which the client library asks for when it opens a stream). The
// deadlines are far above those bounds, for loaded machines.
func TestDeadSubscriberConnection_ProbeReplacesIt_NothingLost(t *testing.T) {
	t.Parallel()
	for mode, ackDeadline := range map[string]time.Duration{"RunBatch": pubsub.MinAckDeadline, "Run": 60 * time.Second} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			topo := testTopology()
			for i := range topo.Subscriptions {
				if topo.Subscriptions[i].ID == subA {
					topo.Subscriptions[i].AckDeadline = pubsub.MinAckDeadline
				}
			}
			emu := pubsubtest.New(t, topo)
			proxy := pgtest.NewStallProxy(t, emu.Addr)
			pub, err := pubsub.NewPublisher(emu.Client, topicA, pubsub.PublisherConfig{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pub.Stop)
			reader := sdkmetric.NewManualReader()
			meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")
			sub, err := pubsub.NewSubscriber(emu.Client, subA, pubsub.SubscriberConfig{
				EmptyPollInterval: 10 * time.Millisecond, ProbeInterval: 500 * time.Millisecond, ProbeTimeout: 500 * time.Millisecond,
			}, discard(), meter, pubsub.WithOwnConnection(pubsub.ClientConfig{EmulatorHost: proxy.Addr()}))
			if err != nil {
				t.Fatal(err)
			}
			var got deliveries
			handle := func(_ context.Context, m *pubsub.Received) error { got.add(m); return nil }
			if mode == "Run" {
				run(t, func(ctx context.Context) error { return sub.Run(ctx, handle) })
			} else {
				run(t, func(ctx context.Context) error {
					return sub.RunBatch(ctx, func(ctx context.Context, ms []*pubsub.Received) []error {
						errs := make([]error, len(ms))
						for i, m := range ms {
							errs[i] = handle(ctx, m)
						}
						return errs
					})
				})
			}
			publish(t, pub, "order-1", "before")
			waitfor.Condition(t, wait, "the first message received", func() bool { return len(got.of("before")) > 0 })
			dialed := proxy.Accepted()

			proxy.StallOpen()
			publish(t, pub, "order-2", "during")
			waitfor.Condition(t, 30*time.Second, "the probe replaced the dead connection", func() bool {
				return counter(t, reader, "pubsub.subscriber.reconnects") >= 1
			})
			// The emulator forgets the abandoned stream only once it sees
			// the connection close, a moment after the replacement; a
			// message it hands to that stream meanwhile comes back after
			// its ack deadline. So a fresh message goes out every half
			// second until one arrives through the fresh connection, and
			// every one of them must arrive in the end.
			sent := []string{"during"}
			lastSent := time.Time{}
			waitfor.Condition(t, 30*time.Second, "a message published after the replacement received", func() bool {
				for _, id := range sent[1:] {
					if len(got.of(id)) > 0 {
						return true
					}
				}
				if time.Since(lastSent) >= 500*time.Millisecond {
					id := fmt.Sprintf("after-%d", len(sent))
					publish(t, pub, "order-"+id, id) // a key of its own: none waits behind another
					sent, lastSent = append(sent, id), time.Now()
				}
				return false
			})
			waitfor.Condition(t, ackDeadline+30*time.Second, "every message published while or after the connection was dead received",
				func() bool {
					for _, id := range sent {
						if len(got.of(id)) == 0 {
							return false
						}
					}
					return true
				})
			if proxy.Accepted() <= dialed {
				t.Errorf("connections through the proxy: %d, want more than the %d before the cut", proxy.Accepted(), dialed)
			}
		})
	}
}

func counter(t *testing.T, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, p := range s.DataPoints {
					n += p.Value
				}
			}
		}
	}
	return n
}
