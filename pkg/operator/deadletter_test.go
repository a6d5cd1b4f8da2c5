package operator_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// A dead-letter topic and the inspection subscription operators replay
// from, as a service's topology declares them.
const (
	deadLetterTopic      = "orders-dead-letter"
	deadLetterInspection = "orders-dead-letter.inspect"
)

var deadLetterTopology = pubsub.Topology{
	Topics:        []pubsub.Topic{{ID: deadLetterTopic}},
	Subscriptions: []pubsub.Subscription{{ID: deadLetterInspection, Topic: deadLetterTopic, AckDeadline: 10 * time.Second, MessageRetention: 24 * time.Hour}},
}

// One replay acks exactly the messages its handler reports handled and
// releases the rest (unselected, failed, all of a dry run), which come back
// on the inspection subscription.
func TestReplay_AcksHandledReleasesTheRest(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, deadLetterTopology)
	ctx := context.Background()
	pub, err := pubsub.NewPublisher(emu.Client, deadLetterTopic, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	ids := map[string]string{} // payload -> message id
	for _, data := range []string{"ok-1", "fails", "ok-2", "other"} {
		if ids[data], err = pub.PublishRaw(ctx, []byte(data), map[string]string{}, ""); err != nil {
			t.Fatal(err)
		}
	}
	r, err := operator.NewDeadLetterReplayer(emu.Client, deadLetterInspection, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Replay(ctx, operator.DeadLetterRequest{MaxMessages: operator.MaxDeadLetters + 1}, nil); !errors.Is(err, operator.ErrInvalidRequest) {
		t.Fatalf("max above the limit: %v", err)
	}
	mustNotRun := func(context.Context, []*pubsub.Received) []error {
		t.Error("handler called")
		return nil
	}
	dry, err := r.Replay(ctx, operator.DeadLetterRequest{MaxMessages: 10, DryRun: true}, mustNotRun)
	if err != nil || !dry.DryRun {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	// A listed id never pulled: everything pulled is released untouched.
	if _, err := r.Replay(ctx, operator.DeadLetterRequest{MaxMessages: 10, MessageIDs: []string{"no-such-id"}}, mustNotRun); err != nil {
		t.Fatal(err)
	}
	selected := []string{ids["ok-1"], ids["fails"], ids["ok-2"]}
	handled := map[string]int{}
	failedSeen := false
	waitfor.Condition(t, 30*time.Second, "both good messages handled", func() bool {
		res, err := r.Replay(ctx, operator.DeadLetterRequest{MaxMessages: 10, MessageIDs: selected},
			func(_ context.Context, ms []*pubsub.Received) []error {
				errs := make([]error, len(ms))
				for i, m := range ms {
					if string(m.Data) == "fails" {
						errs[i] = errors.New("database unavailable")
						continue
					}
					handled[string(m.Data)]++
				}
				return errs
			})
		if slices.Contains(res.Failed, ids["fails"]) {
			failedSeen = true
			if err == nil {
				t.Error("a failed message must fail the replay")
			}
		}
		return handled["ok-1"] == 1 && handled["ok-2"] == 1
	})
	if !failedSeen {
		t.Fatal("the failing message was never handed to the handler")
	}
	// The failed and the unselected messages are still there; the handled
	// ones were acked and never come back.
	var rest []string
	waitfor.Condition(t, 30*time.Second, "failed and unselected messages still on the subscription", func() bool {
		_, err := r.Replay(ctx, operator.DeadLetterRequest{MaxMessages: 10}, func(_ context.Context, ms []*pubsub.Received) []error {
			for _, m := range ms {
				rest = append(rest, string(m.Data))
			}
			return make([]error, len(ms))
		})
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(rest, "fails") && slices.Contains(rest, "other")
	})
	if slices.Contains(rest, "ok-1") || slices.Contains(rest, "ok-2") {
		t.Fatalf("acked messages came back: %v", rest)
	}
	if handled["ok-1"] != 1 || handled["ok-2"] != 1 {
		t.Fatalf("handled %v, want each good message once", handled)
	}
}
