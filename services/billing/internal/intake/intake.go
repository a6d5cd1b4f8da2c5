// Package intake is billing's idempotent consumer of the work-order service's
// events (subscription billing.workorder-events): for each
// WorkOrderCompletionRecorded it enqueues the invoice job. The skeleton is
// pkg/consumer's: the event's marker and the job commit in one transaction,
// a batch at a time, and the message is acked only after that commit; a
// redelivery, or a concurrent delivery of the same event, finds the marker
// and commits nothing new.
//
// This package supplies what is billing's own: the decoder (the envelope's
// rules, then the proto's and what the worker needs to build the invoice,
// decode.go) and apply (the job, one per order: I3). Messages that cannot
// become a job are parked with their raw bytes and the reason, counted
// (billing.intake.messages), and acked (F9); an event type billing does not
// consume is parked and counted apart (unknown_type). Only infrastructure
// failures nack (F15).
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
	"go.opentelemetry.io/otel/metric"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Consumer is the marker's consumer name in processed_events.
const Consumer = "billing.invoicing"

// EventType is the event billing invoices.
var EventType = string((&eventsv1.WorkOrderCompletionRecorded{}).ProtoReflect().Descriptor().FullName())

// DefaultMaxPayloadBytes is Config.MaxPayloadBytes's default: 1 MiB. A
// completion event is a few hundred bytes; Pub/Sub allows up to 10 MB.
const DefaultMaxPayloadBytes = consumer.DefaultMaxPayloadBytes

// Config of the consumer; its subscription is topology.SubWorkOrderEvents.
// The zero value of every field means its default.
type Config struct {
	// JobMaxAttempts is the attempt budget of each invoice job. Default
	// leasequeue.DefaultMaxAttempts.
	JobMaxAttempts int
	// MaxPayloadBytes caps a message's payload: a larger one is parked
	// unparsed, with its raw bytes, instead of being decoded and copied
	// into a job. Default DefaultMaxPayloadBytes; 1..10 MiB.
	MaxPayloadBytes int
}

// consumer is c's share of pkg/consumer's settings.
func (c Config) consumer() consumer.Settings {
	return consumer.Settings{MaxPayloadBytes: c.MaxPayloadBytes}
}

// Validate reports an unusable configuration; zero fields take their
// defaults.
func (c Config) Validate() error {
	var errs []error
	if c.JobMaxAttempts < 0 || c.JobMaxAttempts > 1000 {
		errs = append(errs, fmt.Errorf("JobMaxAttempts %d: want 0..1000", c.JobMaxAttempts))
	}
	errs = append(errs, c.consumer().Validate())
	return errors.Join(errs...)
}

// Outcomes of one message.
const (
	OutcomeEnqueued           = "enqueued"
	OutcomeDuplicate          = consumer.OutcomeDuplicate
	OutcomeOrderAlreadyQueued = "order_already_queued"
	OutcomeParked             = consumer.OutcomeParked
	// OutcomeUnknownType: an event type this consumer does not read,
	// parked like any other message it cannot process.
	OutcomeUnknownType = consumer.OutcomeUnknownType
)

// Intake consumes WorkOrderCompletionRecorded events into invoice jobs:
// Handle, HandleBatch, Process and Replay are pkg/consumer's.
type Intake = consumer.Consumer[*eventsv1.WorkOrderCompletionRecorded]

// ErrStillRefused is returned by Replay when the parked message still cannot
// become a job; the row stays open.
var ErrStillRefused = consumer.ErrStillRefused

// Option configures New: consumer.WithParked, consumer.WithSchema.
type Option = consumer.Option

// WithParked sets where messages are parked. Default: a parked.Store with the
// default schema, the one migrations.Billing migrates.
func WithParked(s *parked.Store) Option { return consumer.WithParked(s) }

// New returns the consumer, its transactions on db (the workers' pool).
// meter may be nil.
func New(db pgdb.DB, queue *leasequeue.Queue, cfg Config, logger *slog.Logger, meter metric.Meter, opts ...Option) (*Intake, error) {
	if db == nil || queue == nil || logger == nil {
		return nil, errors.New("intake: nil pool, queue or logger")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("intake: %w", err)
	}
	meter = telemetry.MeterOrNoop(meter)
	messages, err := meter.Int64Counter("billing.intake.messages",
		metric.WithDescription("Messages consumed, by outcome: enqueued, duplicate, order_already_queued, parked, unknown_type (parked too). Alert on parked and unknown_type."))
	if err != nil {
		return nil, err
	}
	hops, err := orderhop.New(meter)
	if err != nil {
		return nil, err
	}
	validator, err := protovalidate.New()
	if err != nil {
		return nil, fmt.Errorf("intake: validator: %w", err)
	}
	a := applier{queue: queue, jobMaxAttempts: cfg.JobMaxAttempts, logger: logger}
	return consumer.New(db, consumer.Handler[*eventsv1.WorkOrderCompletionRecorded]{
		Name:      Consumer,
		EventType: EventType,
		Decode:    decoder{validator: validator}.decode,
		Apply:     a.apply,
		Subject:   (*eventsv1.WorkOrderCompletionRecorded).GetWorkOrderId,
		Messages:  messages,
		Outcomes:  []string{OutcomeEnqueued, OutcomeOrderAlreadyQueued},
		Committed: func(ctx context.Context, ev *eventsv1.WorkOrderCompletionRecorded, outcome string) {
			if outcome == OutcomeEnqueued {
				// completed_at is when the work-order service recorded the
				// completion (its correlation), the start of this hop.
				hops.Observe(ctx, orderhop.BillingIntake, orderhop.Time(ev.GetCompletedAt()), time.Now())
			}
		},
	}, cfg.consumer().For(topology.SubWorkOrderEvents), logger, opts...)
}

// applier enqueues the invoice job of an event.
type applier struct {
	queue          *leasequeue.Queue
	jobMaxAttempts int
	logger         *slog.Logger
}

// apply enqueues ev's invoice job in tx, where the skeleton claimed ev's
// marker.
func (a applier) apply(ctx context.Context, tx pgx.Tx, ev *eventsv1.WorkOrderCompletionRecorded, m *pubsub.Received) (string, error) {
	// The job keeps the trace context of the consumer span this delivery
	// runs under (pkg/pubsub), or else the message's own: the worker's span
	// links to it (docs/adr/0009).
	tp, ts := telemetry.TraceHeaders(ctx)
	if tp == "" {
		tp, ts = m.Attributes[pubsub.AttrTraceparent], m.Attributes[pubsub.AttrTracestate]
	}
	n, err := a.queue.Enqueue(ctx, tx, leasequeue.NewJob{
		UniqueKey:   ev.GetWorkOrderId(),
		Payload:     m.Data,
		MaxAttempts: a.jobMaxAttempts,
		Traceparent: tp,
		Tracestate:  ts,
	})
	if err != nil {
		return "", err
	}
	if n == 0 {
		// A distinct event announcing the same order's completion: the
		// order's job exists, and one order gets one invoice (I3).
		a.logger.WarnContext(ctx, "second completion event for an order that already has its invoice job; no second job",
			"event_id", ev.GetEventId(), "work_order_id", ev.GetWorkOrderId())
		return OutcomeOrderAlreadyQueued, nil
	}
	return OutcomeEnqueued, nil
}
