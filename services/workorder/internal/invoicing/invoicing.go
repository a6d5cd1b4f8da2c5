// Package invoicing is the work-order service's consumer of billing's
// InvoiceIssued events (subscription workorder.billing-events): it moves the
// order COMPLETED → INVOICED, records the invoice id and a transition with
// cause "billing:<invoice number>", and bumps the version, once per event.
// The skeleton is pkg/consumer's (marker in the same transaction, a batch at
// a time; ack after commit); this package supplies the decoder (decode.go)
// and apply.
//
// An InvoiceIssued for an order that is not COMPLETED is parked, not retried:
// billing only invoices an order this service announced as completed, in the
// transaction that made it COMPLETED (outbox), so by causality the order is
// COMPLETED or already INVOICED when the event arrives. Any other state means
// lost or restored data, or an invariant broken upstream (a second invoice for
// one order, I3); waiting will not fix it and retrying would only hide it
// until the dead-letter topic's retention ran out. apply refuses it (a
// permanent error): its effects and its marker roll back, and the message is
// parked (pkg/parked, table parked_messages) with raw bytes and the reason,
// counted (workorder.invoicing.messages{outcome="parked"}) for the alarm, and
// replayed by an operator (Replay: ticket and actor required) through the
// same path.
//
// The same invoice announced again under another event id (re-published) is
// recognised: the order is INVOICED with that invoice id, nothing changes.
//
// Nothing is dropped silently and one message's data never fails another:
// a message that is unparseable, oversize, carries bytes the database cannot
// store, or that the database rejects anyway (pgdb.IsData) is parked the same
// way; an event type this consumer does not apply is parked and counted apart
// (outcome unknown_type). Only infrastructure failures nack.
package invoicing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// Consumer is the marker's consumer name in processed_events.
const Consumer = "workorder.invoicing"

// EventType is the event this consumer applies.
var EventType = string((&eventsv1.InvoiceIssued{}).ProtoReflect().Descriptor().FullName())

// Outcomes of one message, the attribute of workorder.invoicing.messages.
const (
	OutcomeInvoiced  = "invoiced"
	OutcomeDuplicate = consumer.OutcomeDuplicate
	OutcomeParked    = consumer.OutcomeParked
	// OutcomeUnknownType: an event type this consumer does not apply,
	// parked like any other message it cannot process.
	OutcomeUnknownType = consumer.OutcomeUnknownType
)

// DefaultMaxPayloadBytes is Config.MaxPayloadBytes's default: 1 MiB. An
// InvoiceIssued is a few hundred bytes; Pub/Sub allows up to 10 MB.
const DefaultMaxPayloadBytes = consumer.DefaultMaxPayloadBytes

// MaxEventIDLength is the longest event id the marker stores.
const MaxEventIDLength = consumer.MaxEventIDLength

// DefaultConcurrency is Config.Concurrency's default.
const DefaultConcurrency = consumer.DefaultConcurrency

// Config of the consumer (pkg/consumer's Settings: MaxPayloadBytes,
// Concurrency); its subscription is topology.SubBillingEvents. The zero
// value of every field means its default.
type Config = consumer.Settings

// Invoicing applies InvoiceIssued events to work orders: Handle,
// HandleBatch, Process and Replay are pkg/consumer's.
type Invoicing = consumer.Consumer[*eventsv1.InvoiceIssued]

// Option configures New: consumer.WithParked, consumer.WithSchema.
type Option = consumer.Option

// WithParked sets where messages are parked and replayed from. Default: a
// parked.Store in the default schema, the one migrations.WorkOrder
// migrates.
func WithParked(s *parked.Store) Option { return consumer.WithParked(s) }

// ErrAuditRequired is returned by Replay without a ticket or an actor (I6).
var ErrAuditRequired = consumer.ErrAuditRequired

// ErrStillRefused is returned by Replay when the parked message still
// cannot be applied; nothing changed.
var ErrStillRefused = consumer.ErrStillRefused

// New returns the consumer, its transactions on db (the workers' pool).
// Wire it in the workorder binary:
//
//	inv, _ := invoicing.New(pool, cfg, logger, meter)
//	sub, _ := pubsub.NewSubscriber(client, topology.SubBillingEvents, cfg, logger, meter)
//	server.WithWorker("invoicing", func(ctx context.Context) error { return sub.RunBatch(ctx, inv.HandleBatch) })
//
// meter may be nil.
func New(db pgdb.DB, cfg Config, logger *slog.Logger, meter metric.Meter, opts ...Option) (*Invoicing, error) {
	if db == nil || logger == nil {
		return nil, errors.New("invoicing: nil pool or logger")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invoicing: %w", err)
	}
	meter = telemetry.MeterOrNoop(meter)
	messages, err := meter.Int64Counter("workorder.invoicing.messages",
		metric.WithDescription("InvoiceIssued messages consumed, by outcome: invoiced, duplicate, parked, unknown_type (parked too). Alert on parked and unknown_type."))
	if err != nil {
		return nil, err
	}
	hops, err := orderhop.New(meter)
	if err != nil {
		return nil, err
	}
	return consumer.New(db, consumer.Handler[*eventsv1.InvoiceIssued]{
		Name:      Consumer,
		EventType: EventType,
		Decode:    decode,
		Apply:     apply,
		Subject:   (*eventsv1.InvoiceIssued).GetWorkOrderId,
		Messages:  messages,
		Outcomes:  []string{OutcomeInvoiced},
		Committed: func(ctx context.Context, ev *eventsv1.InvoiceIssued, outcome string) {
			if outcome == OutcomeInvoiced {
				hops.Observe(ctx, orderhop.Invoiced, orderhop.Time(ev.GetIssuedAt()), time.Now())
				logger.DebugContext(ctx, "work order invoiced", "work_order_id", ev.GetWorkOrderId(),
					"invoice_id", ev.GetInvoiceId(), "invoice_number", ev.GetInvoiceNumber())
			}
		},
	}, cfg.For(topology.SubBillingEvents), logger, opts...)
}

// refuse is apply's refusal: the skeleton rolls back ev's effects and its
// marker and parks the message with reason.
func refuse(reason string) error { return retry.Permanent(errors.New(reason)) }

// apply invoices ev's order in tx, where the skeleton claimed ev's marker.
// The order is locked before it is read: of two concurrent applications
// only one invoices, the second waits for the lock and then sees INVOICED.
func apply(ctx context.Context, tx pgx.Tx, ev *eventsv1.InvoiceIssued, _ *pubsub.Received) (string, error) {
	orderID, invoiceID := uuid.MustParse(ev.GetWorkOrderId()), uuid.MustParse(ev.GetInvoiceId())
	repo := orders.InTx(tx)
	o, err := repo.Lock(ctx, orderID)
	switch {
	case errors.Is(err, orders.ErrNotFound):
		return "", refuse("unknown work order " + orderID.String())
	case err != nil:
		return "", fmt.Errorf("invoicing: read order %s: %w", orderID, err)
	}
	res, err := o.Invoice(invoiceID, "billing:"+ev.GetInvoiceNumber())
	var second *orders.SecondInvoiceError
	switch {
	case errors.As(err, &second):
		current := second.Current
		if current == "" {
			current = "<nil>"
		}
		return "", refuse(fmt.Sprintf("order already %s with invoice %s, not %s: second invoice for one order (I3)",
			orders.StatusInvoiced, current, invoiceID))
	case errors.Is(err, orders.ErrIllegalTransition):
		return "", refuse(fmt.Sprintf("order is %s, not %s", o.Status, orders.StatusCompleted))
	case err != nil:
		return "", fmt.Errorf("invoicing: invoice order %s: %w", orderID, err)
	case res == orders.AlreadyInvoiced:
		return OutcomeDuplicate, nil // the same invoice, re-announced
	}
	if err := repo.Save(ctx, &o); err != nil {
		return "", fmt.Errorf("invoicing: invoice order %s: %w", orderID, err)
	}
	return OutcomeInvoiced, nil
}
