// Package receiver is the work-order service's Pub/Sub receiver for
// work-order-completed: receive, ONE batched insert into the inbox, ack after
// commit. Nothing else happens between receipt and ack (seed 000: before the
// ack only what can fail technically). A database error nacks the whole
// batch; Pub/Sub redelivers it (F15).
package receiver

import (
	"context"
	"errors"
	"log/slog"
	"strconv"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/workorder/internal/correlation"
)

// Receiver stores every delivered message in the inbox.
type Receiver struct {
	store  *inbox.Store
	sub    *pubsub.Subscriber
	logger *slog.Logger
}

// New returns a receiver reading sub (pubsub.SubWorkOrderCompleted) into store.
func New(store *inbox.Store, sub *pubsub.Subscriber, logger *slog.Logger) (*Receiver, error) {
	if store == nil || sub == nil || logger == nil {
		return nil, errors.New("receiver: New needs a store, a subscriber and a logger")
	}
	return &Receiver{store: store, sub: sub, logger: logger}, nil
}

// Run receives batches until ctx is cancelled.
func (r *Receiver) Run(ctx context.Context) error {
	return r.sub.RunBatch(ctx, Handle(r.store, r.logger))
}

// Handle returns the batch handler: decode (pure CPU, cannot fail: an
// undecodable message becomes a poison entry), one Ingest, then every
// message's result is the transaction's: all acked or all nacked.
func Handle(store *inbox.Store, logger *slog.Logger) pubsub.BatchHandler {
	return func(ctx context.Context, ms []*pubsub.Received) []error {
		msgs := make([]inbox.Message, len(ms))
		// Under the subscriber's consumer span (linked to each message's
		// producer) every entry keeps THAT span's context, so the inbox
		// relay links to the receipt, which links to the publish (ADR 0009).
		tp, ts := telemetry.TraceHeaders(ctx)
		for i, m := range ms {
			msgs[i] = Decode(m)
			if tp != "" {
				msgs[i].Traceparent, msgs[i].Tracestate = tp, ts
			}
		}
		res, err := store.Ingest(ctx, msgs)
		errs := make([]error, len(ms))
		if err != nil {
			logger.WarnContext(ctx, "inbox receiver: insert failed; nacking batch", "messages", len(ms), "error", err)
			for i := range errs {
				errs[i] = err
			}
			return errs
		}
		if res.Poison > 0 || res.Conflicts > 0 {
			logger.ErrorContext(ctx, "inbox receiver: poison or conflicting messages stored for an operator",
				"poison", res.Poison, "conflicts", res.Conflicts)
		}
		return errs
	}
}

// Decode turns a delivery into an inbox message. Validation failures (F9:
// unparseable, schema-invalid, missing ids, unknown schema_version or
// event_type) produce a message with ParkReason POISON: stored with its raw
// bytes and attributes, acked, never retried.
func Decode(m *pubsub.Received) inbox.Message {
	attrs := m.Attributes
	msg := inbox.Message{
		Source:          correlation.Source,
		EventType:       attrs[pubsub.AttrEventType],
		Payload:         m.Data,
		Attributes:      attrs,
		MessageID:       m.ID,
		DeliveryAttempt: m.DeliveryAttempt,
		Traceparent:     attrs[pubsub.AttrTraceparent],
		Tracestate:      attrs[pubsub.AttrTracestate],
	}
	version, verr := strconv.Atoi(attrs[pubsub.AttrSchemaVersion])
	msg.SchemaVersion = version
	ev, err := correlation.Parse(msg.EventType, version, m.Data)
	if verr != nil {
		err = errors.Join(correlation.ErrInvalid, errors.New("schema_version attribute missing or not an integer"))
	}
	if err == nil && attrs[pubsub.AttrEventID] != "" && attrs[pubsub.AttrEventID] != ev.EventID {
		err = errors.Join(correlation.ErrInvalid, errors.New("event_id attribute differs from the payload's event_id"))
	}
	if err == nil {
		msg.EventID, msg.CorrelationKey = ev.EventID, ev.OrderID.String()
		return msg
	}
	// Poison. Keyed by the claimed event id if there is one (a later valid
	// message under it then shows up as a conflict, which it is), else by
	// the message id, so a redelivery of the same poison still dedups.
	msg.ParkReason, msg.ParkError = inbox.ReasonPoison, err.Error()
	msg.EventID = attrs[pubsub.AttrEventID]
	if msg.EventID == "" || len(msg.EventID) > 200 {
		msg.EventID = "pubsub-message:" + m.ID
	}
	if _, uerr := uuid.Parse(m.OrderingKey); uerr == nil {
		msg.CorrelationKey = m.OrderingKey
	}
	return msg
}
