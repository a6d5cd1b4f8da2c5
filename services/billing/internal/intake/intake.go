// Package intake is billing's idempotent consumer of the work-order service's
// events (subscription billing.workorder-events). For each
// WorkOrderCompletionRecorded it inserts the event's id into processed_events
// first and enqueues the invoice job, in one transaction; the message is acked
// only after that commit. A redelivery, or a concurrent delivery of the same
// event, finds the marker and commits nothing new.
//
// Nothing is dropped silently. Messages that cannot become a job
// (unparseable, oversize, wrong schema version, invalid content, bytes the
// database cannot store, an event id reused with other content) are parked
// (pkg/parked) with their raw bytes and the reason, counted, and acked:
// never lost, never retried forever (F9; the same rule as the inbox's poison
// handling). An event type billing does not consume is parked the same way
// and counted apart (outcome unknown_type), because it means a producer
// publishes something this consumer was not built for. Only infrastructure
// failures nack, so Pub/Sub redelivers (F15); one message's data never takes
// its batch down (see HandleBatch).
//
// Operators re-enter messages through the same path: the dead letters of
// the subscription (Process, `billing dead-letters replay`) and, once their
// cause is fixed, parked messages (Replay, `billing parked replay`).
package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"buf.build/go/protovalidate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/dedup"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgnotify"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Consumer is the dedup marker's consumer name in processed_events.
const Consumer = "billing.invoicing"

// EventType is the event billing invoices.
var EventType = string((&eventsv1.WorkOrderCompletionRecorded{}).ProtoReflect().Descriptor().FullName())

// DefaultMaxPayloadBytes is Config.MaxPayloadBytes's default: 1 MiB. A
// completion event is a few hundred bytes; Pub/Sub allows up to 10 MB.
const DefaultMaxPayloadBytes = 1 << 20

// maxPayloadBytesLimit is Pub/Sub's own message size limit: a cap above it
// would never apply.
const maxPayloadBytesLimit = 10 << 20

// Config of the consumer. The zero value of every field means its default.
type Config struct {
	// Subscription the messages come from, recorded with parked messages.
	// Default topology.SubWorkOrderEvents.
	Subscription string
	// JobMaxAttempts is the attempt budget of each invoice job. Default
	// leasequeue.DefaultMaxAttempts.
	JobMaxAttempts int
	// MaxPayloadBytes caps a message's payload: a larger one is parked
	// unparsed, with its raw bytes, instead of being decoded and copied
	// into a job. Default DefaultMaxPayloadBytes; 1..10 MiB.
	MaxPayloadBytes int
}

func (c *Config) setDefaults() {
	if c.Subscription == "" {
		c.Subscription = topology.SubWorkOrderEvents
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
}

// Validate reports an unusable configuration; zero fields take their
// defaults.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.JobMaxAttempts < 0 || c.JobMaxAttempts > 1000 {
		errs = append(errs, fmt.Errorf("JobMaxAttempts %d: want 0..1000", c.JobMaxAttempts))
	}
	if c.MaxPayloadBytes < 1 || c.MaxPayloadBytes > maxPayloadBytesLimit {
		errs = append(errs, fmt.Errorf("MaxPayloadBytes %d: want 1..%d", c.MaxPayloadBytes, maxPayloadBytesLimit))
	}
	if p := pgtext.Problem(c.Subscription); p != "" {
		errs = append(errs, fmt.Errorf("subscription %q: %s", c.Subscription, p))
	}
	return errors.Join(errs...)
}

// Intake consumes WorkOrderCompletionRecorded events into invoice jobs.
type Intake struct {
	pool     *pgxpool.Pool
	queue    *leasequeue.Queue
	parked   *parked.Store
	cfg      Config
	logger   *slog.Logger
	decoder  decoder
	outcomes metric.Int64Counter
	hops     *orderhop.Recorder
}

// Option configures New.
type Option func(*Intake)

// WithParked sets where messages are parked. Default: a parked.Store with the
// default schema, the one migrations.Billing migrates.
func WithParked(s *parked.Store) Option { return func(in *Intake) { in.parked = s } }

// New returns the consumer. meter may be nil.
func New(pool *pgxpool.Pool, queue *leasequeue.Queue, cfg Config, logger *slog.Logger, meter metric.Meter, opts ...Option) (*Intake, error) {
	if pool == nil || queue == nil || logger == nil {
		return nil, errors.New("intake: nil pool, queue or logger")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("intake: %w", err)
	}
	if meter == nil {
		meter = noop.NewMeterProvider().Meter("")
	}
	outcomes, err := meter.Int64Counter("billing.intake.messages",
		metric.WithDescription("Messages consumed, by outcome: enqueued, duplicate, order_already_queued, parked, unknown_type (parked too). Alert on parked and unknown_type."))
	if err != nil {
		return nil, err
	}
	// Every outcome's series exists at 0 from the start: the alerts read
	// increase() over it, which cannot see a series' first sample.
	for _, o := range []string{OutcomeEnqueued, OutcomeDuplicate, OutcomeOrderAlreadyQueued, OutcomeParked, OutcomeUnknownType} {
		outcomes.Add(context.Background(), 0, metric.WithAttributes(attribute.String("outcome", o)))
	}
	hops, err := orderhop.New(meter)
	if err != nil {
		return nil, err
	}
	validator, err := protovalidate.New()
	if err != nil {
		return nil, fmt.Errorf("intake: validator: %w", err)
	}
	in := &Intake{pool: pool, queue: queue, cfg: cfg, logger: logger, outcomes: outcomes, hops: hops,
		decoder: decoder{validator: validator, maxPayloadBytes: cfg.MaxPayloadBytes}}
	for _, o := range opts {
		o(in)
	}
	if in.parked == nil {
		if in.parked, err = parked.New(); err != nil {
			return nil, fmt.Errorf("intake: %w", err)
		}
	}
	return in, nil
}

// Outcomes of one message.
const (
	OutcomeEnqueued           = "enqueued"
	OutcomeDuplicate          = "duplicate"
	OutcomeOrderAlreadyQueued = "order_already_queued"
	OutcomeParked             = "parked"
	// OutcomeUnknownType: an event type this consumer does not read,
	// parked like any other message it cannot process.
	OutcomeUnknownType = "unknown_type"
)

// Handle consumes one message: nil means durably handled (ack).
func (in *Intake) Handle(ctx context.Context, m *pubsub.Received) error {
	return in.HandleBatch(ctx, []*pubsub.Received{m})[0]
}

// HandleBatch consumes a batch in one transaction (one commit for all):
// every statement in it is conflict-tolerant (ON CONFLICT DO NOTHING), so one
// message's duplicate never aborts the others, and the decoder parks what the
// database would reject before it gets there.
//
// Should the database still reject a message's data (pgdb.IsData: a rule
// the decoder does not know), the batch runs again with a savepoint per
// message: the offending message's effects roll back to its savepoint and it
// is parked with the rule it broke, in the same transaction as its
// batch-mates' effects. Any other error nacks the whole batch; redelivery is
// safe because nothing of it committed.
func (in *Intake) HandleBatch(ctx context.Context, ms []*pubsub.Received) []error {
	_, errs := in.Process(ctx, ms)
	return errs
}

// Process consumes ms as HandleBatch does and also returns each message's
// outcome (all "" when the batch failed), for an operator's replay of dead
// letters to report.
func (in *Intake) Process(ctx context.Context, ms []*pubsub.Received) ([]string, []error) {
	verdicts := make([]verdict, len(ms))
	for i, m := range ms {
		verdicts[i] = in.decoder.decode(m)
	}
	outcomes, err := in.commit(ctx, ms, verdicts, false)
	if pgdb.IsData(err) {
		in.logger.WarnContext(ctx, "database rejected a message's data; isolating the batch's messages", "messages", len(ms), "error", err)
		outcomes, err = in.commit(ctx, ms, verdicts, true)
	}
	errs := make([]error, len(ms))
	if err != nil {
		in.logger.ErrorContext(ctx, "intake transaction failed; messages nacked for redelivery", "messages", len(ms), "error", err)
		for i := range errs {
			errs[i] = err
		}
		return make([]string, len(ms)), errs
	}
	enqueued := time.Now()
	for i, o := range outcomes {
		in.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", o)))
		if o == OutcomeEnqueued {
			// completed_at is when the work-order service recorded the
			// completion (its correlation), the start of this hop.
			in.hops.Observe(ctx, orderhop.BillingIntake, orderhop.Time(verdicts[i].ev.GetCompletedAt()), enqueued)
		}
	}
	return outcomes, errs
}

// commit handles ms in one transaction; with isolate, each message under its
// own savepoint. The workers are woken after the commit (pgnotify).
func (in *Intake) commit(ctx context.Context, ms []*pubsub.Received, verdicts []verdict, isolate bool) ([]string, error) {
	outcomes := make([]string, len(ms))
	ctx, notes := pgnotify.Defer(ctx)
	err := pgx.BeginFunc(ctx, in.pool, func(tx pgx.Tx) error {
		for i, m := range ms {
			var err error
			if isolate {
				outcomes[i], err = in.handleIsolated(ctx, tx, m, verdicts[i])
			} else {
				outcomes[i], err = in.handle(ctx, tx, m, verdicts[i])
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		notes.Flush(ctx, in.pool, in.logger)
	}
	return outcomes, err
}

// handleIsolated handles m under a savepoint (parked.Isolate). A data error
// rolls back m's effects only, and m is parked instead, naming the rule.
func (in *Intake) handleIsolated(ctx context.Context, tx pgx.Tx, m *pubsub.Received, v verdict) (string, error) {
	var outcome string
	reason, err := parked.Isolate(ctx, tx, func(sp pgx.Tx) error {
		var err error
		outcome, err = in.handle(ctx, sp, m, v)
		return err
	})
	if err != nil || reason == "" {
		return outcome, err
	}
	return in.park(ctx, tx, m, verdict{ev: v.ev, outcome: OutcomeParked, reason: reason})
}

func (in *Intake) handle(ctx context.Context, tx pgx.Tx, m *pubsub.Received, v verdict) (string, error) {
	if v.outcome != "" {
		return in.park(ctx, tx, m, v)
	}
	outcome, reason, err := in.apply(ctx, tx, m, v.ev)
	if err != nil || reason == "" {
		return outcome, err
	}
	in.logger.ErrorContext(ctx, "event id reused with different content: producer bug; message parked",
		"event_id", v.ev.GetEventId(), "work_order_id", v.ev.GetWorkOrderId())
	return in.park(ctx, tx, m, verdict{ev: v.ev, outcome: OutcomeParked, reason: reason})
}

// apply runs the dedup marker and the job of a decoded event in tx. A
// non-empty reason means the event must not become a job (the caller parks
// it, or refuses a replay).
func (in *Intake) apply(ctx context.Context, tx pgx.Tx, m *pubsub.Received, ev *eventsv1.WorkOrderCompletionRecorded) (outcome, reason string, err error) {
	out, err := dedup.Claim(ctx, tx, dedup.Event{Consumer: Consumer, ID: ev.GetEventId(), Type: EventType, Payload: m.Data})
	if err != nil {
		return "", "", err
	}
	switch out {
	case dedup.Duplicate:
		in.logger.DebugContext(ctx, "duplicate delivery; nothing to do", "event_id", ev.GetEventId(), "message_id", m.ID)
		return OutcomeDuplicate, "", nil
	case dedup.Conflict:
		return "", "event id already processed with different content (producer bug)", nil
	}
	// The job keeps the trace context of the consumer span this delivery
	// runs under (pkg/pubsub), or else the message's own: the worker's span
	// links to it (docs/adr/0009).
	tp, ts := telemetry.TraceHeaders(ctx)
	if tp == "" {
		tp, ts = m.Attributes[pubsub.AttrTraceparent], m.Attributes[pubsub.AttrTracestate]
	}
	n, err := in.queue.Enqueue(ctx, tx, leasequeue.NewJob{
		UniqueKey:   ev.GetWorkOrderId(),
		Payload:     m.Data,
		MaxAttempts: in.cfg.JobMaxAttempts,
		Traceparent: tp,
		Tracestate:  ts,
	})
	if err != nil {
		return "", "", err
	}
	if n == 0 {
		// A distinct event announcing the same order's completion: the
		// order's job exists, and one order gets one invoice (I3).
		in.logger.WarnContext(ctx, "second completion event for an order that already has its invoice job; no second job",
			"event_id", ev.GetEventId(), "work_order_id", ev.GetWorkOrderId())
		return OutcomeOrderAlreadyQueued, "", nil
	}
	return OutcomeEnqueued, "", nil
}

// ErrStillRefused is returned by Replay when the parked message still cannot
// become a job; the row stays open.
var ErrStillRefused = errors.New("intake: parked message still refused")

// Replay consumes the open parked message parkedID through the normal path
// (decoder, dedup marker, job), once an operator fixed its cause (a payload
// cap raised, a rule relaxed by a deploy), and marks it replayed by actor
// under ticket in the same transaction: a transaction of its own on a pool,
// a savepoint when db is the caller's transaction. When the message still
// cannot become a job nothing changes and the error wraps ErrStillRefused
// with the reason; a second Replay of the row finds it closed
// (parked.ErrNotOpen).
func (in *Intake) Replay(ctx context.Context, db pgdb.DB, parkedID int64, ticket, actor string) (outcome string, err error) {
	err = in.parked.Replay(ctx, db, parkedID, ticket, actor, func(ctx context.Context, tx pgx.Tx, p parked.Parked) error {
		if p.Subscription != in.cfg.Subscription {
			return fmt.Errorf("intake: parked message %d is from %s, not %s", parkedID, p.Subscription, in.cfg.Subscription)
		}
		m := &pubsub.Received{ID: p.MessageID, Attributes: p.Attributes, Data: p.Data}
		v := in.decoder.decode(m)
		if v.outcome != "" {
			return fmt.Errorf("%w: %d: %s", ErrStillRefused, parkedID, v.reason)
		}
		var reason string
		if outcome, reason, err = in.apply(ctx, tx, m, v.ev); err != nil {
			return err
		}
		if reason != "" {
			return fmt.Errorf("%w: %d: %s", ErrStillRefused, parkedID, reason)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return outcome, nil
}

// park stores m with v's reason in tx, with its batch-mates' effects, and
// returns v's outcome.
func (in *Intake) park(ctx context.Context, tx pgx.Tx, m *pubsub.Received, v verdict) (string, error) {
	st, err := in.parked.Park(ctx, tx, parkedMessage(in.cfg.Subscription, m, v))
	if err != nil {
		return "", fmt.Errorf("intake: %w", err)
	}
	if v.outcome == OutcomeUnknownType {
		in.logger.ErrorContext(ctx, "event type not consumed by billing; message parked", "message_id", m.ID,
			"event_type", m.Attributes[pubsub.AttrEventType], "parked_id", st.ID, "reason", st.Reason)
	} else {
		in.logger.ErrorContext(ctx, "message parked", "message_id", m.ID, "event_id", v.ev.GetEventId(),
			"parked_id", st.ID, "reason", st.Reason)
	}
	return v.outcome, nil
}
