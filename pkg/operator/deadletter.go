// DeadLetterReplayer replays the messages parked on a dead-letter inspection
// subscription (pkg/pubsub.DeadLetterInspectionID) through a consumer's own
// batch handler, the one its live subscription runs: the handler's dedup
// makes a second replay, or the replay of a message it already stored, a
// no-op, and its parking keeps a still-bad message instead of sending it
// round again.
//
// One call makes one unary Pull of at most DeadLetterRequest.MaxMessages (an operator
// wants what is there now, bounded), hands the selected messages to the
// handler, acks each one only after the handler reported it durably
// handled, and releases (nacks) the rest: the unselected, the failed, and in
// a dry run all of them. Auditing is the caller's: it knows its audit log.

package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// MaxDeadLetters bounds DeadLetterRequest.MaxMessages: no "replay everything".
const MaxDeadLetters = 1000

// settleTimeout bounds the ack and the release after the handler ran: they
// must be attempted even when the operator's context was cancelled meanwhile.
const settleTimeout = 30 * time.Second

// DeadLetterRequest selects the dead letters of one replay.
type DeadLetterRequest struct {
	// MaxMessages bounds the pull (1..MaxDeadLetters, required).
	MaxMessages int
	// MessageIDs restricts the replay to these Pub/Sub message ids; the
	// other messages pulled are released untouched for a later look.
	MessageIDs []string
	// DryRun pulls, reports and releases: the handler is not called,
	// nothing is acked.
	DryRun bool
}

// DeadLetterResult reports one replay.
type DeadLetterResult struct {
	// MessageIDs are the selected messages, in pull order: handed to the
	// handler, or, in a dry run, the ones that would have been.
	MessageIDs []string
	// Failed are the selected messages the handler returned an error for:
	// released, they come back on the inspection subscription.
	Failed []string
	DryRun bool
}

// DeadLetterReplayer replays one inspection subscription.
type DeadLetterReplayer struct {
	client *gpubsub.Client
	sub    string // full resource name
	logger *slog.Logger
}

// NewDeadLetterReplayer returns a DeadLetterReplayer for subscription, the inspection subscription's
// id (not its full resource name).
func NewDeadLetterReplayer(client *gpubsub.Client, subscription string, logger *slog.Logger) (*DeadLetterReplayer, error) {
	if client == nil || subscription == "" || logger == nil {
		return nil, errors.New("operator: NewDeadLetterReplayer needs a client, a subscription and a logger")
	}
	return &DeadLetterReplayer{client: client, sub: pubsub.SubscriptionName(client.Project(), subscription), logger: logger}, nil
}

// Replay pulls once and hands the selected messages to handle (one batch),
// then acks those it returned nil for and releases the others. When handle
// failed for any, the DeadLetterResult lists them and the error is the first failure:
// the others were handled and acked all the same.
func (r *DeadLetterReplayer) Replay(ctx context.Context, req DeadLetterRequest, handle pubsub.BatchHandler) (DeadLetterResult, error) {
	if req.MaxMessages < 1 || req.MaxMessages > MaxDeadLetters {
		return DeadLetterResult{}, fmt.Errorf("%w: max messages must be within 1..%d", ErrInvalidRequest, MaxDeadLetters)
	}
	if handle == nil {
		return DeadLetterResult{}, errors.New("operator: dead letters: nil handler")
	}
	resp, err := r.client.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{Subscription: r.sub, MaxMessages: int32(req.MaxMessages), ReturnImmediately: true}) //nolint:staticcheck // ReturnImmediately: an operator wants what is there now
	if err != nil {
		return DeadLetterResult{}, fmt.Errorf("operator: dead letters: pull %s: %w", r.sub, err)
	}
	res := DeadLetterResult{DryRun: req.DryRun}
	var take []*pubsub.Received
	var takeAck, release []string
	for _, rm := range resp.GetReceivedMessages() {
		m := rm.GetMessage()
		if len(req.MessageIDs) > 0 && !slices.Contains(req.MessageIDs, m.GetMessageId()) {
			release = append(release, rm.GetAckId())
			continue
		}
		attrs := m.GetAttributes()
		if attrs == nil {
			attrs = map[string]string{}
		}
		take = append(take, &pubsub.Received{ID: m.GetMessageId(), Data: m.GetData(), Attributes: attrs,
			OrderingKey: m.GetOrderingKey(), PublishTime: m.GetPublishTime().AsTime()})
		takeAck = append(takeAck, rm.GetAckId())
		res.MessageIDs = append(res.MessageIDs, m.GetMessageId())
	}
	if req.DryRun || len(take) == 0 {
		r.release(append(release, takeAck...))
		return res, nil
	}
	errs := handle(ctx, take)
	if len(errs) != len(take) {
		// As pkg/pubsub's subscriber: a result of another length fails all.
		errs = slices.Repeat([]error{fmt.Errorf("operator: dead letters: handler returned %d results for %d messages", len(errs), len(take))}, len(take))
	}
	var ack []string
	var first error
	for i, err := range errs {
		if err == nil {
			ack = append(ack, takeAck[i])
			continue
		}
		release = append(release, takeAck[i])
		res.Failed = append(res.Failed, take[i].ID)
		if first == nil {
			first = err
		}
	}
	r.release(release)
	r.ack(ctx, ack)
	if first != nil {
		return res, fmt.Errorf("operator: dead letters: %d of %d dead letters not handled, released: %w", len(res.Failed), len(take), first)
	}
	return res, nil
}

// ack acknowledges what the handler committed. A failed ack is only logged:
// the message comes back, and replaying it again is a no-op.
func (r *DeadLetterReplayer) ack(ctx context.Context, ackIDs []string) {
	if len(ackIDs) == 0 {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err := r.client.SubscriptionAdminClient.Acknowledge(actx, &pubsubpb.AcknowledgeRequest{Subscription: r.sub, AckIds: ackIDs}); err != nil {
		r.logger.WarnContext(ctx, "operator: dead letters: ack of replayed dead letters failed; they come back, a replay is a no-op", "error", err)
	}
}

// release makes messages deliverable again at once. A failed release only
// delays them until their ack deadline expires.
func (r *DeadLetterReplayer) release(ackIDs []string) {
	if len(ackIDs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	_ = r.client.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{
		Subscription: r.sub, AckIds: ackIDs, AckDeadlineSeconds: 0})
}
