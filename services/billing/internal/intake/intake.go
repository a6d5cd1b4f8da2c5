// Package intake is billing's idempotent consumer of the work-order service's
// events (subscription billing.workorder-events). For each
// WorkOrderCompletionRecorded it inserts the event's id into processed_events
// first and enqueues the invoice job, in one transaction; the message is acked
// only after that commit (seed 002). A redelivery, or a concurrent delivery of
// the same event, finds the marker and commits nothing new.
//
// Messages that cannot become a job (unparseable, wrong schema version,
// invalid content, an event id reused with other content) are parked in
// parked_messages with their raw bytes and the reason, counted, and acked:
// never lost, never retried forever (F9; the same rule as the inbox's poison
// handling). Event types billing does not consume are acked and counted.
// Only database failures nack, so Pub/Sub redelivers (F15).
package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"buf.build/go/protovalidate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/dedup"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/billing/internal/issuer"
)

// Consumer is the dedup marker's consumer name in processed_events.
const Consumer = "billing.invoicing"

// EventType is the event billing invoices.
var EventType = string((&eventsv1.WorkOrderCompletionRecorded{}).ProtoReflect().Descriptor().FullName())

// Config of the consumer.
type Config struct {
	// Subscription the messages come from, recorded with parked messages.
	// Default pubsub.SubWorkOrderEvents.
	Subscription string
	// JobMaxAttempts is the attempt budget of each invoice job. Default
	// leasequeue.DefaultMaxAttempts.
	JobMaxAttempts int
}

// Intake consumes WorkOrderCompletionRecorded events into invoice jobs.
type Intake struct {
	pool      *pgxpool.Pool
	queue     *leasequeue.Queue
	cfg       Config
	logger    *slog.Logger
	validator protovalidate.Validator
	outcomes  metric.Int64Counter
}

// New returns the consumer. meter may be nil.
func New(pool *pgxpool.Pool, queue *leasequeue.Queue, cfg Config, logger *slog.Logger, meter metric.Meter) (*Intake, error) {
	if pool == nil || queue == nil || logger == nil {
		return nil, errors.New("intake: nil pool, queue or logger")
	}
	if cfg.Subscription == "" {
		cfg.Subscription = pubsub.SubWorkOrderEvents
	}
	if cfg.JobMaxAttempts < 0 || cfg.JobMaxAttempts > 1000 {
		return nil, fmt.Errorf("intake: JobMaxAttempts %d: want 0..1000", cfg.JobMaxAttempts)
	}
	if meter == nil {
		meter = noop.NewMeterProvider().Meter("")
	}
	outcomes, err := meter.Int64Counter("billing.intake.messages",
		metric.WithDescription("Messages consumed, by outcome: enqueued, duplicate, order_already_queued, parked, ignored. Alert on parked."))
	if err != nil {
		return nil, err
	}
	// Every outcome's series exists at 0 from the start: the parked alert
	// reads increase() over it, which cannot see a series' first sample.
	for _, o := range []string{OutcomeEnqueued, OutcomeDuplicate, OutcomeOrderAlreadyQueued, OutcomeParked, OutcomeIgnored} {
		outcomes.Add(context.Background(), 0, metric.WithAttributes(attribute.String("outcome", o)))
	}
	validator, err := protovalidate.New()
	if err != nil {
		return nil, fmt.Errorf("intake: validator: %w", err)
	}
	return &Intake{pool: pool, queue: queue, cfg: cfg, logger: logger, validator: validator, outcomes: outcomes}, nil
}

// Outcomes of one message.
const (
	OutcomeEnqueued           = "enqueued"
	OutcomeDuplicate          = "duplicate"
	OutcomeOrderAlreadyQueued = "order_already_queued"
	OutcomeParked             = "parked"
	OutcomeIgnored            = "ignored"
)

// Handle consumes one message: nil means durably handled (ack).
func (in *Intake) Handle(ctx context.Context, m *pubsub.Received) error {
	return in.HandleBatch(ctx, []*pubsub.Received{m})[0]
}

// HandleBatch consumes a batch in one transaction (one commit for all):
// every statement in it is conflict-tolerant (ON CONFLICT DO NOTHING), so one
// message's duplicate never aborts the others. A database error nacks the
// whole batch; redelivery is safe because nothing of it committed.
func (in *Intake) HandleBatch(ctx context.Context, ms []*pubsub.Received) []error {
	errs := make([]error, len(ms))
	outcomes := make([]string, len(ms))
	err := pgx.BeginFunc(ctx, in.pool, func(tx pgx.Tx) error {
		for i, m := range ms {
			var err error
			if outcomes[i], err = in.handle(ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		in.logger.ErrorContext(ctx, "intake transaction failed; messages nacked for redelivery", "messages", len(ms), "error", err)
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for _, o := range outcomes {
		in.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", o)))
	}
	return errs
}

func (in *Intake) handle(ctx context.Context, tx pgx.Tx, m *pubsub.Received) (string, error) {
	eventType := m.Attributes[pubsub.AttrEventType]
	switch {
	case eventType == "":
		return in.park(ctx, tx, m, "", "missing attribute "+pubsub.AttrEventType)
	case eventType != EventType:
		in.logger.DebugContext(ctx, "event type not consumed by billing; acked", "event_type", eventType, "message_id", m.ID)
		return OutcomeIgnored, nil
	}
	if v := m.Attributes[pubsub.AttrSchemaVersion]; v != "" && v != "1" {
		return in.park(ctx, tx, m, "", "unsupported schema_version "+v+" (this consumer reads 1)")
	}
	var ev eventsv1.WorkOrderCompletionRecorded
	if err := proto.Unmarshal(m.Data, &ev); err != nil {
		return in.park(ctx, tx, m, "", "unparseable payload: "+err.Error())
	}
	if reason := validate(in.validator, &ev, m.Attributes[pubsub.AttrEventID]); reason != "" {
		return in.park(ctx, tx, m, ev.GetEventId(), reason)
	}
	out, err := dedup.Claim(ctx, tx, dedup.Event{Consumer: Consumer, ID: ev.GetEventId(), Type: EventType, Payload: m.Data})
	if err != nil {
		return "", err
	}
	switch out {
	case dedup.Duplicate:
		in.logger.DebugContext(ctx, "duplicate delivery; nothing to do", "event_id", ev.GetEventId(), "message_id", m.ID)
		return OutcomeDuplicate, nil
	case dedup.Conflict:
		in.logger.ErrorContext(ctx, "event id reused with different content: producer bug; message parked",
			"event_id", ev.GetEventId(), "work_order_id", ev.GetWorkOrderId())
		return in.park(ctx, tx, m, ev.GetEventId(), "event id already processed with different content (producer bug)")
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
		return "", err
	}
	if n == 0 {
		// A distinct event announcing the same order's completion: the
		// order's job exists, and one order gets one invoice (I3).
		in.logger.WarnContext(ctx, "second completion event for an order that already has its invoice job; no second job",
			"event_id", ev.GetEventId(), "work_order_id", ev.GetWorkOrderId())
		return OutcomeOrderAlreadyQueued, nil
	}
	return OutcomeEnqueued, nil
}

// validate returns why ev cannot be invoiced, or "".
func validate(validator protovalidate.Validator, ev *eventsv1.WorkOrderCompletionRecorded, attrEventID string) string {
	var reasons []string
	if ev.GetEventId() == "" {
		reasons = append(reasons, "event_id: missing")
	} else if attrEventID != "" && attrEventID != ev.GetEventId() {
		reasons = append(reasons, fmt.Sprintf("event_id %q differs from attribute event_id %q", ev.GetEventId(), attrEventID))
	}
	if err := validator.Validate(ev); err != nil {
		reasons = append(reasons, err.Error())
	}
	if _, err := issuer.OrderFromEvent(ev); err != nil {
		reasons = append(reasons, err.Error())
	}
	return strings.Join(reasons, "; ")
}

// qPark keeps a message that cannot be processed; a redelivery of the same
// message is parked once.
const qPark = `
INSERT INTO parked_messages (subscription, message_id, event_id, event_type, attributes, data, reason)
VALUES ($1, $2, nullif($3, ''), nullif($4, ''), $5, $6, $7)
ON CONFLICT (subscription, message_id) DO NOTHING`

func (in *Intake) park(ctx context.Context, tx pgx.Tx, m *pubsub.Received, eventID, reason string) (string, error) {
	attrs, err := json.Marshal(m.Attributes)
	if err != nil {
		return "", err
	}
	data := m.Data
	if data == nil {
		data = []byte{}
	}
	if _, err := tx.Exec(ctx, qPark, in.cfg.Subscription, m.ID, eventID, m.Attributes[pubsub.AttrEventType], attrs, data, reason); err != nil {
		return "", fmt.Errorf("intake: park message %s: %w", m.ID, err)
	}
	in.logger.ErrorContext(ctx, "message parked", "message_id", m.ID, "event_id", eventID, "reason", reason)
	return OutcomeParked, nil
}
