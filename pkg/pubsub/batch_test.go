package pubsub_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// pullSizes records the MaxMessages of every Pull the emulator serves.
type pullSizes struct {
	mu    sync.Mutex
	sizes []int32
}

func (p *pullSizes) React(req any) (bool, any, error) {
	if r, ok := req.(*pubsubpb.PullRequest); ok {
		p.mu.Lock()
		p.sizes = append(p.sizes, r.GetMaxMessages())
		p.mu.Unlock()
	}
	return false, nil, nil
}

func (p *pullSizes) last() int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sizes) == 0 {
		return 0
	}
	return p.sizes[len(p.sizes)-1]
}

// A pulled batch larger than MaxBatchBytes reaches the handler in several
// calls, none above the bound except a lone oversize message; every message
// is acked once; later Pulls ask for as many messages as fit in the bound.
func TestRunBatchBoundsHandlerCallsByBytes(t *testing.T) {
	t.Parallel()
	const (
		bound   = 64 << 10
		msgSize = 10 << 10
		small   = 40
	)
	pulls := &pullSizes{}
	emu := pubsubtest.New(t, testTopology(), pstest.ServerReactorOption{FuncName: "Pull", Reactor: pulls})
	topic := pubsub.TopicName(emu.ProjectID, topicA)
	// Published before the subscriber starts, so the first Pull (of the
	// default 500 messages) returns all of them: 500 KiB in one response.
	var events []string
	for i := range small {
		ev := fmt.Sprintf("ev-%d", i)
		events = append(events, ev)
		emu.Server.Publish(topic, bytes.Repeat([]byte{'x'}, msgSize), map[string]string{pubsub.AttrEventID: ev})
	}
	emu.Server.Publish(topic, bytes.Repeat([]byte{'X'}, 100<<10), map[string]string{pubsub.AttrEventID: "ev-oversize"})
	events = append(events, "ev-oversize")

	sub, err := pubsub.NewSubscriber(emu.Client, subA, pubsub.SubscriberConfig{BatchConcurrency: 1, MaxBatchBytes: bound}, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		calls [][]int // data sizes per handler call
	)
	run(t, func(ctx context.Context) error {
		return sub.RunBatch(ctx, func(_ context.Context, ms []*pubsub.Received) []error {
			sizes := make([]int, len(ms))
			for i, m := range ms {
				sizes[i] = len(m.Data)
			}
			mu.Lock()
			calls = append(calls, sizes)
			mu.Unlock()
			return make([]error, len(ms))
		})
	})
	waitfor.Condition(t, wait, "every message acked", func() bool {
		for _, ev := range events {
			if acks(emu, ev) != 1 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	seen := 0
	for _, sizes := range calls {
		total := 0
		for _, s := range sizes {
			total += s
		}
		seen += len(sizes)
		if total > bound && len(sizes) > 1 {
			t.Errorf("handler call with %d messages of %d bytes in all, want at most %d", len(sizes), total, bound)
		}
	}
	if seen != len(events) {
		t.Errorf("handler saw %d messages, want %d (each once)", seen, len(events))
	}
	if len(calls) < (small*msgSize)/bound {
		t.Errorf("%d handler calls for %d bytes, want the batch split", len(calls), small*msgSize)
	}

	// The next Pull asks for about bound / mean message size, not 500.
	waitfor.Condition(t, wait, "a Pull after the batch", func() bool { return len(pullSizesSnapshot(pulls)) >= 2 })
	if n := pulls.last(); n < 1 || n > bound/msgSize {
		t.Errorf("Pull after %d-byte messages asks for %d messages, want 1..%d", msgSize, n, bound/msgSize)
	}
}

func pullSizesSnapshot(p *pullSizes) []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int32(nil), p.sizes...)
}

func TestMaxBatchBytesMustNotBeNegative(t *testing.T) {
	t.Parallel()
	if err := (pubsub.SubscriberConfig{MaxBatchBytes: -1}).Validate(); err == nil {
		t.Fatal("negative MaxBatchBytes accepted")
	}
	if d := pubsub.DefaultSubscriberConfig().MaxBatchBytes; d != 16<<20 {
		t.Fatalf("default MaxBatchBytes %d, want 16 MiB", d)
	}
}
