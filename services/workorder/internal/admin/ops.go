// Package admin is the work-order service's privileged operator surface for
// the inbox (I6): list, show, replay parked entries, replay dead letters,
// cleanup, and the manual re-hand-off. The same operations are reachable as
// CLI commands (RunCLI, `workorder inbox ...`) and as the gRPC service
// lossless.workorder.v1.WorkOrderAdminService (Service), which requires the
// operator token. Every mutating operation needs a ticket and an actor and
// writes an operator_audit row.
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// Deps are what the operator operations need.
type Deps struct {
	// Pool on the work-order database (required).
	Pool *pgxpool.Pool
	// PubSub client, needed only to replay dead letters (nil: refused).
	PubSub *gpubsub.Client
	// DeadLetterSubscription to replay from. Default topology.SubWorkOrderCompletedDeadLetter.
	DeadLetterSubscription string
	// Receiver configures how replayed dead letters are decoded; pass the
	// receiver's own configuration (zero: the receiver's defaults).
	Receiver receiver.Config
	// Logger (required).
	Logger *slog.Logger
}

// Ops implements the operator operations shared by the CLI and gRPC.
type Ops struct {
	deps   Deps
	orders *orders.Repository
	inbox  *inbox.Ops
	store  *inbox.Store
	dec    *receiver.Decoder
}

// NewOps validates deps.
func NewOps(deps Deps) (*Ops, error) {
	if deps.Pool == nil || deps.Logger == nil {
		return nil, errors.New("admin: Deps need a Pool and a Logger")
	}
	if deps.DeadLetterSubscription == "" {
		deps.DeadLetterSubscription = topology.SubWorkOrderCompletedDeadLetter
	}
	io, err := inbox.NewOps(deps.Pool, inbox.WithAudit(operatorAudit))
	if err != nil {
		return nil, err
	}
	store, err := inbox.NewStore(deps.Pool, nil)
	if err != nil {
		return nil, err
	}
	dec, err := receiver.NewDecoder(deps.Receiver)
	if err != nil {
		return nil, err
	}
	repo, err := orders.NewRepository(deps.Pool)
	if err != nil {
		return nil, err
	}
	return &Ops{deps: deps, orders: repo, inbox: io, store: store, dec: dec}, nil
}

// Inbox returns the generic inbox operations (list, get, replay, cleanup).
func (o *Ops) Inbox() *inbox.Ops { return o.inbox }

// DeadLetterRequest selects dead letters to re-enter.
type DeadLetterRequest struct {
	inbox.Authorization
	// MessageIDs restricts the replay to these message ids; others pulled
	// are released untouched (nacked) for a later look.
	MessageIDs []string
	// MaxMessages bounds the pull (1..1000, required: no "replay everything").
	MaxMessages int
	// DryRun pulls, reports and releases; nothing is inserted or acked.
	DryRun bool
}

// DeadLetterResult reports a dead-letter replay.
type DeadLetterResult struct {
	MessageIDs []string
	inbox.IngestResult
	DryRun bool
}

// ReplayDeadLetters pulls up to MaxMessages from the dead-letter inspection
// subscription and re-enters the selected ones through the receiver's own
// path (receiver.Decoder + inbox.Store.Ingest: the same unique key, so a
// message already in the inbox is a no-op), acks them only after that
// commit, then audits the run. As in the receiver, a message that cannot be
// stored as received is parked (poison) and its batch-mates re-enter; only
// an infrastructure error fails the replay (everything is released). The insert is the receiver's, unchanged, so
// the audit row is a separate transaction right after it.
func (o *Ops) ReplayDeadLetters(ctx context.Context, req DeadLetterRequest) (DeadLetterResult, error) {
	if err := req.Validate(); err != nil {
		return DeadLetterResult{}, fmt.Errorf("%w: %w", inbox.ErrInvalidRequest, err)
	}
	if req.MaxMessages < 1 || req.MaxMessages > inbox.MaxReplayCount {
		return DeadLetterResult{}, fmt.Errorf("%w: max messages must be within 1..%d", inbox.ErrInvalidRequest, inbox.MaxReplayCount)
	}
	if o.deps.PubSub == nil {
		return DeadLetterResult{}, errors.New("admin: no Pub/Sub client configured")
	}
	c := o.deps.PubSub
	sub := pubsub.SubscriptionName(c.Project(), o.deps.DeadLetterSubscription)
	resp, err := c.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: int32(req.MaxMessages), ReturnImmediately: true}) //nolint:staticcheck // ReturnImmediately: an operator wants what is there now
	if err != nil {
		return DeadLetterResult{}, fmt.Errorf("admin: pull dead letters: %w", err)
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
	if req.DryRun {
		release = append(release, takeAck...)
		takeAck = nil
	} else if len(take) > 0 {
		msgs := make([]inbox.Message, len(take))
		for i, m := range take {
			msgs[i] = o.dec.Decode(m)
		}
		if res.IngestResult, err = o.store.Ingest(ctx, msgs); err != nil {
			release = append(release, takeAck...)
			o.nack(sub, release)
			return DeadLetterResult{}, fmt.Errorf("admin: re-enter dead letters: %w", err)
		}
	}
	o.nack(sub, release)
	if len(takeAck) > 0 {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := c.SubscriptionAdminClient.Acknowledge(actx, &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: takeAck}); err != nil {
			// Stored already; an unacked dead letter only comes back, and
			// re-entering it again is a no-op.
			o.deps.Logger.WarnContext(ctx, "admin: ack of replayed dead letters failed", "error", err)
		}
	}
	err = pgx.BeginFunc(ctx, o.deps.Pool, func(tx pgx.Tx) error {
		return audit(ctx, tx, "inbox.replay-dead-letters", req.Authorization, req.DryRun, map[string]any{
			"subscription": o.deps.DeadLetterSubscription, "message_ids": res.MessageIDs, "max_messages": req.MaxMessages,
			"inserted": res.Inserted, "duplicates": res.Duplicates, "poison": res.Poison, "conflicts": res.Conflicts,
		}, len(res.MessageIDs))
	})
	return res, err
}

func (o *Ops) nack(sub string, ackIDs []string) {
	if len(ackIDs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = o.deps.PubSub.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{
		Subscription: sub, AckIds: ackIDs, AckDeadlineSeconds: 0})
}

// ErrOrderNotHandedOff refuses a re-hand-off of an order that is not waiting.
var ErrOrderNotHandedOff = errors.New("admin: work order is not " + string(orders.StatusHandedOff))

// RecordReHandOff records one more open waiting point for a HANDED_OFF
// order, as a manual re-hand-off does (orders.Order.ReHandOff: the repair
// builds the next failure), with a history entry and the audit row in the
// same transaction. With two open waiting points the next completion parks
// as AMBIGUOUS (F7); that is the point: it is visible, not guessed.
func (o *Ops) RecordReHandOff(ctx context.Context, auth inbox.Authorization, orderID uuid.UUID) (wpID int64, open int, err error) {
	if err := auth.Validate(); err != nil {
		return 0, 0, fmt.Errorf("%w: %w", inbox.ErrInvalidRequest, err)
	}
	err = pgx.BeginFunc(ctx, o.deps.Pool, func(tx pgx.Tx) error {
		var illegal *orders.IllegalTransitionError
		wo, err := o.orders.UpdateTx(ctx, tx, orderID, func(wo *orders.Order) error {
			return wo.ReHandOff("operator:re-hand-off:" + auth.Ticket)
		})
		switch {
		case errors.Is(err, orders.ErrNotFound):
			return fmt.Errorf("%w: unknown work order %s", inbox.ErrInvalidRequest, orderID)
		case errors.As(err, &illegal):
			return fmt.Errorf("%w (status %s)", ErrOrderNotHandedOff, illegal.From)
		case err != nil:
			return err
		}
		// The new waiting point has the highest id: it is the last open one.
		points := wo.OpenWaitingPoints()
		wpID, open = points[len(points)-1], len(points)
		return audit(ctx, tx, "workorder.re-hand-off", auth, false,
			map[string]any{"work_order_id": orderID.String(), "waiting_point_id": wpID, "open_waiting_points": open}, 1)
	})
	return wpID, open, err
}
