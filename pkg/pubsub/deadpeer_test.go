package pubsub_test

import (
	"context"
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
