// Package invoicing is the work-order service's consumer of billing's
// InvoiceIssued events (subscription workorder.billing-events): it moves the
// order COMPLETED → INVOICED, records the invoice id and a transition with
// cause "billing:<invoice number>", and bumps the version, once per event
// (pkg/dedup marker in the same transaction; ack after commit).
//
// An InvoiceIssued for an order that is not COMPLETED is parked, not retried:
// billing only invoices an order this service announced as completed, in the
// transaction that made it COMPLETED (outbox), so by causality the order is
// COMPLETED or already INVOICED when the event arrives. Any other state means
// lost or restored data, or an invariant broken upstream (a second invoice for
// one order, I3); waiting will not fix it and retrying would only hide it
// until the dead-letter topic's retention ran out. The message is kept in
// parked_billing_events with raw bytes and the reason, counted
// (workorder.invoicing.messages{outcome="parked"}) for the alarm, and replayed
// by an operator (Replay: ticket and actor required) through the same path.
//
// The same invoice announced again under another event id (re-published) is
// recognised: the order is INVOICED with that invoice id, nothing changes.
package invoicing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/dedup"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// Consumer is the dedup marker's consumer name in processed_events.
const Consumer = "workorder.invoicing"

// EventType is the event this consumer applies.
var EventType = string((&eventsv1.InvoiceIssued{}).ProtoReflect().Descriptor().FullName())

// Outcomes of one message, the attribute of workorder.invoicing.messages.
const (
	OutcomeInvoiced  = "invoiced"
	OutcomeDuplicate = "duplicate"
	OutcomeParked    = "parked"
	OutcomeIgnored   = "ignored"
)

// Invoicing applies InvoiceIssued events to work orders.
type Invoicing struct {
	pool     *pgxpool.Pool
	logger   *slog.Logger
	outcomes metric.Int64Counter
}

// New returns the consumer. Wire it in the workorder binary:
//
//	inv, _ := invoicing.New(pool, logger, meter)
//	sub, _ := pubsub.NewSubscriber(client, pubsub.SubBillingEvents, cfg, logger, meter)
//	server.WithWorker("invoicing", func(ctx context.Context) error { return sub.RunBatch(ctx, inv.HandleBatch) })
//
// meter may be nil.
func New(pool *pgxpool.Pool, logger *slog.Logger, meter metric.Meter) (*Invoicing, error) {
	if pool == nil || logger == nil {
		return nil, errors.New("invoicing: nil pool or logger")
	}
	if meter == nil {
		meter = noop.NewMeterProvider().Meter("")
	}
	outcomes, err := meter.Int64Counter("workorder.invoicing.messages",
		metric.WithDescription("InvoiceIssued messages consumed, by outcome: invoiced, duplicate, parked, ignored. Alert on parked."))
	if err != nil {
		return nil, err
	}
	return &Invoicing{pool: pool, logger: logger, outcomes: outcomes}, nil
}

// HandleBatch applies each message in its own transaction (orders are
// independent; one parked message must not hold back the others). nil entries
// are acked; an error (database failure) nacks for redelivery.
func (v *Invoicing) HandleBatch(ctx context.Context, ms []*pubsub.Received) []error {
	errs := make([]error, len(ms))
	for i, m := range ms {
		errs[i] = v.Handle(ctx, m)
	}
	return errs
}

// Handle applies one message: nil means durably handled (ack).
func (v *Invoicing) Handle(ctx context.Context, m *pubsub.Received) error {
	outcome, err := v.handle(ctx, m)
	if err != nil {
		v.logger.ErrorContext(ctx, "applying InvoiceIssued failed; nacked for redelivery", "message_id", m.ID, "error", err)
		return err
	}
	v.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
	return nil
}

func (v *Invoicing) handle(ctx context.Context, m *pubsub.Received) (string, error) {
	switch t := m.Attributes[pubsub.AttrEventType]; {
	case t == "":
		return v.park(ctx, m, nil, "missing attribute "+pubsub.AttrEventType)
	case t != EventType:
		return OutcomeIgnored, nil
	}
	ev, reason := decode(m)
	if reason != "" {
		return v.park(ctx, m, ev, reason)
	}
	var outcome string
	err := pgx.BeginFunc(ctx, v.pool, func(tx pgx.Tx) error {
		var err error
		outcome, reason, err = apply(ctx, tx, ev, m.Data)
		if err == nil && reason != "" {
			return errNotApplicable // roll the marker back: a replay must be able to apply
		}
		return err
	})
	if errors.Is(err, errNotApplicable) {
		return v.park(ctx, m, ev, reason)
	}
	if err != nil {
		return "", err
	}
	if outcome == OutcomeInvoiced {
		v.logger.InfoContext(ctx, "work order invoiced", "work_order_id", ev.GetWorkOrderId(),
			"invoice_id", ev.GetInvoiceId(), "invoice_number", ev.GetInvoiceNumber())
	}
	return outcome, nil
}

var errNotApplicable = errors.New("invoicing: event not applicable")

// decode parses and checks an InvoiceIssued message; reason is "" when valid.
func decode(m *pubsub.Received) (*eventsv1.InvoiceIssued, string) {
	if v := m.Attributes[pubsub.AttrSchemaVersion]; v != "" && v != "1" {
		return nil, "unsupported schema_version " + v + " (this consumer reads 1)"
	}
	var ev eventsv1.InvoiceIssued
	if err := proto.Unmarshal(m.Data, &ev); err != nil {
		return nil, "unparseable payload: " + err.Error()
	}
	var reasons []string
	if ev.GetEventId() == "" {
		reasons = append(reasons, "event_id: missing")
	} else if a := m.Attributes[pubsub.AttrEventID]; a != "" && a != ev.GetEventId() {
		reasons = append(reasons, fmt.Sprintf("event_id %q differs from attribute event_id %q", ev.GetEventId(), a))
	}
	if _, err := uuid.Parse(ev.GetWorkOrderId()); err != nil {
		reasons = append(reasons, "work_order_id: not a uuid")
	}
	if _, err := uuid.Parse(ev.GetInvoiceId()); err != nil {
		reasons = append(reasons, "invoice_id: not a uuid")
	}
	if ev.GetInvoiceNumber() == "" {
		reasons = append(reasons, "invoice_number: missing")
	}
	return &ev, strings.Join(reasons, "; ")
}

// qInvoice applies the transition; status = 'COMPLETED' in the WHERE makes it
// a compare-and-set: of two concurrent applications only one row update
// happens (the second blocks on the row lock, then sees INVOICED).
const qInvoice = `
UPDATE work_orders
SET status = 'INVOICED', invoice_id = $2, version = version + 1, updated_at = now()
WHERE id = $1 AND status = 'COMPLETED'
RETURNING version`

const qTransition = `
INSERT INTO work_order_transitions (work_order_id, from_status, to_status, cause)
VALUES ($1, 'COMPLETED', 'INVOICED', $2)`

const qOrderState = `SELECT status, invoice_id FROM work_orders WHERE id = $1`

// apply runs the marker and the effect in tx. A non-empty reason means the
// event cannot be applied (the caller rolls back and parks).
func apply(ctx context.Context, tx pgx.Tx, ev *eventsv1.InvoiceIssued, payload []byte) (outcome, reason string, err error) {
	out, err := dedup.Claim(ctx, tx, dedup.Event{Consumer: Consumer, ID: ev.GetEventId(), Type: EventType, Payload: payload})
	if err != nil {
		return "", "", err
	}
	switch out {
	case dedup.Duplicate:
		return OutcomeDuplicate, "", nil
	case dedup.Conflict:
		return "", "event id already processed with different content (producer bug)", nil
	}
	orderID, invoiceID := uuid.MustParse(ev.GetWorkOrderId()), uuid.MustParse(ev.GetInvoiceId())
	var version int64
	err = tx.QueryRow(ctx, qInvoice, orderID, invoiceID).Scan(&version)
	if err == nil {
		if _, err := tx.Exec(ctx, qTransition, orderID, "billing:"+ev.GetInvoiceNumber()); err != nil {
			return "", "", fmt.Errorf("invoicing: record transition: %w", err)
		}
		return OutcomeInvoiced, "", nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return "", "", fmt.Errorf("invoicing: invoice order %s: %w", orderID, err)
	}
	var status string
	var current *uuid.UUID
	err = tx.QueryRow(ctx, qOrderState, orderID).Scan(&status, &current)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", "unknown work order " + orderID.String(), nil
	case err != nil:
		return "", "", fmt.Errorf("invoicing: read order %s: %w", orderID, err)
	case status == "INVOICED" && current != nil && *current == invoiceID:
		return OutcomeDuplicate, "", nil // the same invoice, re-announced
	case status == "INVOICED":
		return "", fmt.Sprintf("order already INVOICED with invoice %v, not %s: second invoice for one order (I3)", current, invoiceID), nil
	default:
		return "", "order is " + status + ", not COMPLETED", nil
	}
}

// qPark keeps a message that cannot be applied; a redelivery parks once.
const qPark = `
INSERT INTO parked_billing_events (message_id, event_id, work_order_id, attributes, data, reason)
VALUES ($1, nullif($2, ''), $3, $4, $5, $6)
ON CONFLICT (message_id) DO NOTHING`

func (v *Invoicing) park(ctx context.Context, m *pubsub.Received, ev *eventsv1.InvoiceIssued, reason string) (string, error) {
	attrs, err := json.Marshal(m.Attributes)
	if err != nil {
		return "", err
	}
	var orderID *uuid.UUID
	if id, err := uuid.Parse(ev.GetWorkOrderId()); err == nil {
		orderID = &id
	}
	data := m.Data
	if data == nil {
		data = []byte{}
	}
	if _, err := v.pool.Exec(ctx, qPark, m.ID, ev.GetEventId(), orderID, attrs, data, reason); err != nil {
		return "", fmt.Errorf("invoicing: park message %s: %w", m.ID, err)
	}
	v.logger.ErrorContext(ctx, "InvoiceIssued parked", "message_id", m.ID, "event_id", ev.GetEventId(),
		"work_order_id", ev.GetWorkOrderId(), "reason", reason)
	return OutcomeParked, nil
}

// ErrAuditRequired is returned by Replay without a ticket or an actor (I6).
var ErrAuditRequired = errors.New("invoicing: a ticket and an actor are required")

const qParked = `
SELECT message_id, attributes, data FROM parked_billing_events
WHERE id = $1 AND replayed_at IS NULL
FOR UPDATE`

const qMarkReplayed = `
UPDATE parked_billing_events SET replayed_at = now(), replayed_by = $2, ticket = $3 WHERE id = $1`

// Replay applies a parked message through the normal path, after an operator
// fixed its cause, and records who replayed it under which ticket in the same
// transaction. It fails, changing nothing, when the event still cannot be
// applied.
func (v *Invoicing) Replay(ctx context.Context, parkedID int64, ticket, actor string) (outcome string, err error) {
	ticket, actor = strings.TrimSpace(ticket), strings.TrimSpace(actor)
	if ticket == "" || actor == "" {
		return "", ErrAuditRequired
	}
	err = pgx.BeginFunc(ctx, v.pool, func(tx pgx.Tx) error {
		var m pubsub.Received
		var attrs []byte
		if err := tx.QueryRow(ctx, qParked, parkedID).Scan(&m.ID, &attrs, &m.Data); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("invoicing: no unreplayed parked message %d", parkedID)
			}
			return err
		}
		if err := json.Unmarshal(attrs, &m.Attributes); err != nil {
			return err
		}
		ev, reason := decode(&m)
		if reason != "" {
			return fmt.Errorf("invoicing: parked message %d still invalid: %s", parkedID, reason)
		}
		var err error
		if outcome, reason, err = apply(ctx, tx, ev, m.Data); err != nil {
			return err
		}
		if reason != "" {
			return fmt.Errorf("invoicing: parked message %d still not applicable: %s", parkedID, reason)
		}
		_, err = tx.Exec(ctx, qMarkReplayed, parkedID, actor, ticket)
		return err
	})
	if err != nil {
		return "", err
	}
	v.logger.InfoContext(ctx, "parked InvoiceIssued replayed", "parked_id", parkedID, "ticket", ticket, "actor", actor, "outcome", outcome)
	return outcome, nil
}
