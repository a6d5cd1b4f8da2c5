// Package handoff delivers a work order to the provider: it is the outbox
// Dispatcher of WorkOrderHandOffRequested events, calling
// ProviderService.SubmitWorkOrder outside any transaction and recording the
// acceptance (CREATED -> HANDED_OFF, provider job id, waiting point) in the
// transaction that marks the event published.
//
// Cancel races. Cancel and the acceptance both lock the order row, so exactly
// one of them sees CREATED:
//   - cancelled before the dispatch: the dispatcher sees CANCELLED and does
//     not call the provider; the event is marked done (nothing to deliver);
//   - cancelled while the provider call is in flight: the provider has the
//     work and there is no provider cancel RPC. The order stays CANCELLED (the
//     client was told so; billing must not invoice it); the acceptance is
//     recorded in the history with the job id, counted in
//     workorder.handoff.accepted_after_cancel and logged as a warning, and no
//     waiting point is created, so the provider's completion is rejected by
//     correlation where it is visible too.
//
// The window of the second case is one provider round trip. Closing it would
// need a "hand-off in progress" state that blocks cancel, which turns a
// crashed or slow dispatch into an order nobody can cancel; we prefer the
// visible, counted race.
//
// Shutdown: a provider call already in flight when the relay's context is
// cancelled is finished and recorded (see detach); a dispatch that has not
// called the provider yet returns the context error and the relay releases
// the event for the next process.
package handoff

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// EventType is the outbox event type this package dispatches.
var EventType = string((&eventsv1.WorkOrderHandOffRequested{}).ProtoReflect().Descriptor().FullName())

// Config of the Dispatcher.
type Config struct {
	// Deadline bounds one SubmitWorkOrder call (env WORKORDER_HANDOFF_DEADLINE).
	// Default 10s: the provider only records the job before answering; a call
	// slower than that is treated as failed and retried (the provider is
	// idempotent by work order id, so a retry cannot create a second job). It
	// must stay well below the outbox lease (80% of 30 s by default), or the
	// relay cuts the dispatch off first.
	Deadline time.Duration
}

// Validate reports settings that cannot work.
func (c Config) Validate() error {
	if c.Deadline <= 0 {
		return fmt.Errorf("hand-off deadline %v: must be positive", c.Deadline)
	}
	return nil
}

// DefaultDeadline is Config.Deadline's default.
const DefaultDeadline = 10 * time.Second

// ConnectParams are the provider connection's reconnect settings
// (grpc.WithConnectParams). gRPC's default reconnect backoff grows to 120 s:
// after a long provider outage the channel would keep failing calls fast
// (UNAVAILABLE) for up to two minutes after the provider is back, and no
// outbox probe could notice the recovery sooner. Capped at 1 s, a reconnect
// to a refused port costs one failed dial per second.
var ConnectParams = grpc.ConnectParams{
	Backoff: grpcbackoff.Config{
		BaseDelay:  100 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   time.Second,
	},
	MinConnectTimeout: 5 * time.Second,
}

// Dispatcher implements outbox.Dispatcher for hand-off events.
type Dispatcher struct {
	provider providerv1.ProviderServiceClient
	inbox    *inbox.Store // where completions that overtook the hand-off wait (F5)
	checks   *prechecks   // the pre-check reads; concurrent ones share a statement
	cfg      Config
	log      *slog.Logger

	handedOff   metric.Int64Counter
	skipped     metric.Int64Counter
	afterCancel metric.Int64Counter
	rejected    metric.Int64Counter
	hops        *orderhop.Recorder
}

// NewDispatcher returns a Dispatcher calling provider. completions is the
// inbox whose deferred completions a hand-off makes due. Zero config fields
// take their defaults; a nil meter disables metrics.
func NewDispatcher(provider providerv1.ProviderServiceClient, repo *orders.Repository, completions *inbox.Store, cfg Config, logger *slog.Logger, meter metric.Meter) (*Dispatcher, error) {
	switch {
	case provider == nil:
		return nil, errors.New("handoff: provider client is nil")
	case repo == nil:
		return nil, errors.New("handoff: repository is nil")
	case completions == nil:
		return nil, errors.New("handoff: inbox store is nil")
	case logger == nil:
		return nil, errors.New("handoff: logger is nil")
	}
	if cfg.Deadline == 0 {
		cfg.Deadline = DefaultDeadline
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("handoff: %w", err)
	}
	meter = telemetry.MeterOrNoop(meter)
	d := &Dispatcher{provider: provider, inbox: completions, cfg: cfg, log: logger,
		checks: &prechecks{read: repo.Statuses, timeout: cfg.Deadline}}
	var errs [4]error
	d.handedOff, errs[0] = meter.Int64Counter("workorder.handoff.handed_off",
		metric.WithDescription("Work orders accepted by the provider and now waiting for completion."))
	d.skipped, errs[1] = meter.Int64Counter("workorder.handoff.skipped",
		metric.WithDescription("Hand-off events not sent because the order was no longer CREATED (cancelled, or already handed off)."))
	d.afterCancel, errs[2] = meter.Int64Counter("workorder.handoff.accepted_after_cancel",
		metric.WithDescription("Orders the provider accepted after they were cancelled: the provider works on a cancelled order. Alert on any."))
	d.rejected, errs[3] = meter.Int64Counter("workorder.handoff.rejected",
		metric.WithDescription("Hand-offs the provider refused permanently (the event goes to FAILED)."))
	var hopErr error
	d.hops, hopErr = orderhop.New(meter)
	if err := errors.Join(append(errs[:], hopErr)...); err != nil {
		return nil, fmt.Errorf("handoff: metrics: %w", err)
	}
	return d, nil
}

// Dispatch hands the event's order to the provider. See the package comment
// for the outcomes; errors follow classify.
func (d *Dispatcher) Dispatch(ctx context.Context, ev outbox.Event) (outbox.Commit, error) {
	var msg eventsv1.WorkOrderHandOffRequested
	if err := proto.Unmarshal(ev.Payload, &msg); err != nil {
		return nil, retry.Permanent(fmt.Errorf("handoff: decode event %s: %w", ev.ID, err))
	}
	id, err := uuid.Parse(msg.GetWorkOrderId())
	if err != nil {
		return nil, retry.Permanent(fmt.Errorf("handoff: event %s: work order id %q: %w", ev.ID, msg.GetWorkOrderId(), err))
	}
	log := d.log.With("work_order_id", id, "event_id", ev.ID, "attempt", ev.Attempts)

	// Pre-check without a lock: a cancelled order is never sent. The
	// authoritative check is the locked one in the commit. Concurrent
	// dispatches share one read (prechecks).
	current, err := d.checks.status(ctx, id)
	switch {
	case errors.Is(err, orders.ErrNotFound):
		// I1 makes this impossible short of a manual delete: a human must look.
		return nil, retry.Permanent(fmt.Errorf("handoff: event %s: %w", ev.ID, err))
	case err != nil:
		return nil, err
	case current != orders.StatusCreated:
		d.skipped.Add(ctx, 1, metric.WithAttributes(attribute.String("status", string(current))))
		log.InfoContext(ctx, "hand-off not sent: order is no longer CREATED", "status", current)
		return nil, nil
	}

	if err := ctx.Err(); err != nil {
		return nil, err // shutting down: leave the event to the next claim
	}
	callCtx, cancel := detach(ctx, d.cfg.Deadline)
	defer cancel()
	resp, err := d.provider.SubmitWorkOrder(callCtx, &providerv1.SubmitWorkOrderRequest{
		WorkOrderId: id.String(), // the provider's idempotency key
		CustomerId:  msg.GetCustomerId(),
		Description: msg.GetDescription(),
		Positions:   msg.GetPositions(),
	})
	if err != nil {
		code := status.Code(err)
		err = classify(err)
		if retry.IsPermanent(err) {
			d.rejected.Add(ctx, 1, metric.WithAttributes(attribute.String("code", code.String())))
			log.WarnContext(ctx, "provider refused the hand-off permanently", "error", err)
		}
		return nil, fmt.Errorf("handoff: submit work order %s: %w", id, err)
	}
	jobID := resp.GetAcceptance().GetJobId()
	if jobID == "" {
		return nil, retry.Permanent(fmt.Errorf("handoff: provider accepted work order %s without a job id", id))
	}
	return d.commit(trace.SpanContextFromContext(ctx), id, jobID, ev.ID.String(), orderhop.Time(msg.GetOccurredAt()), log), nil
}

// detach returns the context of a provider call: bounded by the hand-off
// deadline and by ctx's own deadline (the relay cuts dispatch off before the
// claim's lease expires), but NOT cancelled with ctx. Cancellation means a
// graceful shutdown, and a call already sent is better finished and recorded
// (bounded by Deadline, below the shutdown timeout) than abandoned: abandoned,
// the provider may have accepted the work while we record nothing until the
// next process dispatches the event again.
func detach(ctx context.Context, deadline time.Duration) (context.Context, context.CancelFunc) {
	detached := context.WithoutCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		c1, cancel1 := context.WithDeadline(detached, dl)
		c2, cancel2 := context.WithTimeout(c1, deadline)
		return c2, func() { cancel2(); cancel1() }
	}
	return context.WithTimeout(detached, deadline)
}

// commit records the acceptance in the relay's mark transaction. Its log
// lines carry the dispatch span's ids (sc), the span of the hand-off call;
// created is the order's creation (the event's occurred_at), the start of
// the handoff hop.
func (d *Dispatcher) commit(sc trace.SpanContext, id uuid.UUID, jobID, eventID string, created time.Time, log *slog.Logger) outbox.Commit {
	return func(ctx context.Context, tx pgx.Tx) error {
		if sc.IsValid() {
			ctx = trace.ContextWithSpanContext(ctx, sc)
		}
		// Lock, decide, then save in one round trip with the statement that
		// makes deferred completions due (orders.InTx(tx).Update would send
		// the save alone). The relay's savepoint, or in slow mode its BEGIN
		// and fence, ride the lock's round trip: the Commit costs two.
		o, err := orders.InTx(tx).Lock(ctx, id)
		if err != nil {
			return fmt.Errorf("handoff: record acceptance of %s: %w", id, err)
		}
		outcome := o.AcceptHandOff(jobID, eventID)
		save := &pgx.Batch{}
		orders.QueueSave(save, &o)
		var due *inbox.Due
		if outcome == orders.HandedOff {
			// The waiting point exists from this commit on: completions that
			// overtook the hand-off (F5) need not sit out their backoff.
			due = d.inbox.QueueMakeDue(save, id.String())
		}
		if save.Len() > 0 {
			if err := tx.SendBatch(ctx, save).Close(); err != nil {
				return fmt.Errorf("handoff: record acceptance of %s: %w", id, err)
			}
		}
		var early int64
		if due != nil {
			if early, err = due.Announce(ctx, tx); err != nil {
				return fmt.Errorf("handoff: record acceptance of %s: %w", id, err)
			}
		}
		switch outcome {
		case orders.HandedOff:
			d.handedOff.Add(ctx, 1)
			d.hops.Observe(ctx, orderhop.HandOff, created, time.Now())
			log.DebugContext(ctx, "work order handed off", "provider_job_id", jobID, "early_completions_released", early)
		case orders.AcceptedAfterCancel:
			d.afterCancel.Add(ctx, 1)
			log.WarnContext(ctx, "provider accepted a work order cancelled during its hand-off; order stays CANCELLED", "provider_job_id", jobID)
		case orders.AlreadyHandedOff:
			log.InfoContext(ctx, "repeated hand-off acceptance ignored", "provider_job_id", jobID)
		}
		return nil
	}
}

// classify marks provider errors that no retry of the same request can fix
// as permanent (the event goes to FAILED and alerts):
//   - INVALID_ARGUMENT, OUT_OF_RANGE: the provider refuses this order's data;
//   - FAILED_PRECONDITION: the provider refuses it in its current state;
//   - UNIMPLEMENTED: we call a method the provider does not have;
//   - ALREADY_EXISTS: the provider broke its idempotency contract (a repeat
//     must return the original acceptance), which needs a human.
//
// UNAVAILABLE (connection refused or reset: the provider is down or
// restarting) and DEADLINE_EXCEEDED (no answer within Deadline) are
// outbox.Unavailable: not this order's fault. The relay charges the event
// nothing and counts the failure against the provider's circuit, which stops
// hand-offs after a few in a row, probes the provider and sends the backlog
// as soon as it answers (pkg/outbox circuit.go).
//
// Everything else is transient and retried with backoff until the outbox's
// attempt limit: RESOURCE_EXHAUSTED and ABORTED (back-pressure), INTERNAL and UNKNOWN (a
// provider bug or a proxy error, often fixed by a redeploy), and also
// UNAUTHENTICATED, PERMISSION_DENIED and NOT_FOUND: they are configuration
// faults fixed by operators, after which the retry succeeds on its own;
// making them permanent would force a replay of every event that failed
// meanwhile. The outbox's age-of-oldest-pending alert covers a long outage.
func classify(err error) error {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition, codes.Unimplemented, codes.AlreadyExists:
		return retry.Permanent(err)
	case codes.Unavailable, codes.DeadlineExceeded:
		return outbox.Unavailable(err)
	default:
		return err
	}
}
