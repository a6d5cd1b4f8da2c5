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
//
// Nothing is dropped silently and one message's data never fails another:
// a message that is unparseable, oversize, carries bytes the database cannot
// store, or that the database rejects anyway (pgerr.IsData) is parked the same
// way; an event type this consumer does not apply is parked and counted apart
// (outcome unknown_type). Only infrastructure failures nack.
package invoicing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/dedup"
	"github.com/lossless-dev/lossless/pkg/pgerr"
	"github.com/lossless-dev/lossless/pkg/pgtext"
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
	// OutcomeUnknownType: an event type this consumer does not apply,
	// parked like any other message it cannot process.
	OutcomeUnknownType = "unknown_type"
)

// DefaultMaxPayloadBytes is Config.MaxPayloadBytes's default: 1 MiB. An
// InvoiceIssued is a few hundred bytes; Pub/Sub allows up to 10 MB.
const DefaultMaxPayloadBytes = 1 << 20

// maxPayloadBytesLimit is Pub/Sub's own message size limit: a cap above it
// would never apply.
const maxPayloadBytesLimit = 10 << 20

// MaxEventIDLength is processed_events.event_id's CHECK limit, in characters
// (migrations/workorder).
const MaxEventIDLength = 200

// Config of the consumer. The zero value of every field means its default.
type Config struct {
	// MaxPayloadBytes caps a message's payload: a larger one is parked
	// unparsed, with its raw bytes. Default DefaultMaxPayloadBytes; 1..10 MiB.
	MaxPayloadBytes int
}

func (c *Config) setDefaults() {
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
}

// Validate reports an unusable configuration; zero fields take their
// defaults.
func (c Config) Validate() error {
	c.setDefaults()
	if c.MaxPayloadBytes < 1 || c.MaxPayloadBytes > maxPayloadBytesLimit {
		return fmt.Errorf("MaxPayloadBytes %d: want 1..%d", c.MaxPayloadBytes, maxPayloadBytesLimit)
	}
	return nil
}

// Option configures New.
type Option func(*Invoicing)

// WithConfig sets the consumer's Config (default: the zero Config).
func WithConfig(cfg Config) Option { return func(v *Invoicing) { v.cfg = cfg } }

// Invoicing applies InvoiceIssued events to work orders.
type Invoicing struct {
	pool     *pgxpool.Pool
	logger   *slog.Logger
	cfg      Config
	decoder  decoder
	outcomes metric.Int64Counter
}

// New returns the consumer. Wire it in the workorder binary:
//
//	inv, _ := invoicing.New(pool, logger, meter, invoicing.WithConfig(cfg))
//	sub, _ := pubsub.NewSubscriber(client, pubsub.SubBillingEvents, cfg, logger, meter)
//	server.WithWorker("invoicing", func(ctx context.Context) error { return sub.RunBatch(ctx, inv.HandleBatch) })
//
// meter may be nil.
func New(pool *pgxpool.Pool, logger *slog.Logger, meter metric.Meter, opts ...Option) (*Invoicing, error) {
	if pool == nil || logger == nil {
		return nil, errors.New("invoicing: nil pool or logger")
	}
	v := &Invoicing{pool: pool, logger: logger}
	for _, o := range opts {
		o(v)
	}
	v.cfg.setDefaults()
	if err := v.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invoicing: %w", err)
	}
	v.decoder = decoder{maxPayloadBytes: v.cfg.MaxPayloadBytes}
	if meter == nil {
		meter = noop.NewMeterProvider().Meter("")
	}
	var err error
	v.outcomes, err = meter.Int64Counter("workorder.invoicing.messages",
		metric.WithDescription("InvoiceIssued messages consumed, by outcome: invoiced, duplicate, parked, unknown_type (parked too). Alert on parked and unknown_type."))
	if err != nil {
		return nil, err
	}
	// Every outcome's series exists at 0 from the start: the alerts read
	// increase() over it, which cannot see a series' first sample.
	for _, o := range []string{OutcomeInvoiced, OutcomeDuplicate, OutcomeParked, OutcomeUnknownType} {
		v.outcomes.Add(context.Background(), 0, metric.WithAttributes(attribute.String("outcome", o)))
	}
	return v, nil
}

// HandleBatch applies each message in its own transaction (orders are
// independent; one parked message must not hold back the others, and one
// transaction per order keeps row locks short and never held across orders).
// nil entries are acked; an error (infrastructure failure) nacks for
// redelivery.
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
	d := v.decoder.decode(m)
	if d.outcome != "" {
		return v.park(ctx, m, d)
	}
	ev := d.ev
	var outcome, reason string
	err := pgx.BeginFunc(ctx, v.pool, func(tx pgx.Tx) error {
		var err error
		outcome, reason, err = apply(ctx, tx, ev, m.Data)
		if err == nil && reason != "" {
			return errNotApplicable // roll the marker back: a replay must be able to apply
		}
		return err
	})
	switch {
	case errors.Is(err, errNotApplicable):
		return v.park(ctx, m, verdict{ev: ev, outcome: OutcomeParked, reason: reason})
	case pgerr.IsData(err):
		// A rule the decoder does not know: the transaction rolled back,
		// marker included, so a replay can apply once the cause is fixed.
		return v.park(ctx, m, verdict{ev: ev, outcome: OutcomeParked, reason: rejected(err)})
	case err != nil:
		return "", err
	}
	if outcome == OutcomeInvoiced {
		v.logger.InfoContext(ctx, "work order invoiced", "work_order_id", ev.GetWorkOrderId(),
			"invoice_id", ev.GetInvoiceId(), "invoice_number", ev.GetInvoiceNumber())
	}
	return outcome, nil
}

var errNotApplicable = errors.New("invoicing: event not applicable")

// rejected is the park reason of a data error: the database's message names
// the rule (constraint, encoding); the SQLSTATE classifies it.
func rejected(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Sprintf("rejected by the database: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	return "rejected by the database: " + err.Error()
}

// verdict is what the decoder decided about one message before any database
// work: apply ev (outcome ""), or park the message with reason under outcome
// (OutcomeParked or OutcomeUnknownType).
type verdict struct {
	ev      *eventsv1.InvoiceIssued // nil when the payload was not parsed
	outcome string
	reason  string
}

// decoder turns a message into a verdict. It is pure and rejects whatever
// the database would reject, so that such a message is parked with the rule
// it broke instead of failing a statement.
type decoder struct {
	maxPayloadBytes int
}

func (d decoder) decode(m *pubsub.Received) verdict {
	switch t := m.Attributes[pubsub.AttrEventType]; {
	case t == "":
		return verdict{outcome: OutcomeParked, reason: "missing attribute " + pubsub.AttrEventType}
	case t != EventType:
		return verdict{outcome: OutcomeUnknownType,
			reason: fmt.Sprintf("unknown event type %q (this consumer reads %s)", t, EventType)}
	}
	reasons := pgtext.MapProblems(m.Attributes)
	park := func(ev *eventsv1.InvoiceIssued, reason ...string) verdict {
		return verdict{ev: ev, outcome: OutcomeParked, reason: strings.Join(append(reasons, reason...), "; ")}
	}
	if len(m.Data) > d.maxPayloadBytes {
		return park(nil, fmt.Sprintf("payload %d bytes exceeds the cap of %d bytes", len(m.Data), d.maxPayloadBytes))
	}
	if v := m.Attributes[pubsub.AttrSchemaVersion]; v != "" && v != "1" {
		return park(nil, "unsupported schema_version "+pgtext.Storable(v)+" (this consumer reads 1)")
	}
	var ev eventsv1.InvoiceIssued
	if err := proto.Unmarshal(m.Data, &ev); err != nil {
		return park(nil, "unparseable payload: "+err.Error())
	}
	reasons = append(reasons, pgtext.MessageProblems(ev.ProtoReflect())...)
	switch id := ev.GetEventId(); {
	case id == "":
		reasons = append(reasons, "event_id: missing")
	case utf8.RuneCountInString(id) > MaxEventIDLength:
		reasons = append(reasons, fmt.Sprintf("event_id: %d characters, limit %d", utf8.RuneCountInString(id), MaxEventIDLength))
	case m.Attributes[pubsub.AttrEventID] != "" && m.Attributes[pubsub.AttrEventID] != id:
		reasons = append(reasons, fmt.Sprintf("event_id %q differs from attribute event_id %q", id, m.Attributes[pubsub.AttrEventID]))
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
	if len(reasons) > 0 {
		return park(&ev)
	}
	return verdict{ev: &ev}
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

// parkedRow is a parked_billing_events row as park stores it.
type parkedRow struct {
	messageID, eventID, reason string
	workOrderID                *uuid.UUID
	attributes                 []byte
	data                       []byte
}

// parkRow builds the row that keeps m with d's reason. Every value is made
// storable: text PostgreSQL cannot hold is stored escaped (message id,
// attributes) or as NULL (event id; the reason quotes it), the reason says
// which, and the raw payload goes to the bytea column as received.
func parkRow(m *pubsub.Received, d verdict) (parkedRow, error) {
	attrs, attrProblems, err := pgtext.StorableJSON(m.Attributes)
	if err != nil {
		return parkedRow{}, err
	}
	var escaped []string
	if len(attrProblems) > 0 {
		escaped = append(escaped, "attributes")
	}
	r := parkedRow{messageID: pgtext.Storable(m.ID), eventID: d.ev.GetEventId(), reason: pgtext.Storable(d.reason),
		attributes: attrs, data: m.Data}
	if id, err := uuid.Parse(d.ev.GetWorkOrderId()); err == nil {
		r.workOrderID = &id
	}
	if pgtext.Problem(m.ID) != "" {
		escaped = append(escaped, "message_id")
	}
	if len(escaped) > 0 {
		r.reason += "; stored escaped: " + strings.Join(escaped, ", ")
	}
	if pgtext.Problem(r.eventID) != "" {
		r.eventID, r.reason = "", r.reason+"; stored as NULL: event_id"
	}
	if r.data == nil {
		r.data = []byte{}
	}
	return r, nil
}

// park stores m with d's reason (see parkRow) and returns d's outcome.
func (v *Invoicing) park(ctx context.Context, m *pubsub.Received, d verdict) (string, error) {
	r, err := parkRow(m, d)
	if err != nil {
		return "", err
	}
	if _, err := v.pool.Exec(ctx, qPark, r.messageID, r.eventID, r.workOrderID, r.attributes, r.data, r.reason); err != nil {
		return "", fmt.Errorf("invoicing: park message %s: %w", r.messageID, err)
	}
	v.logger.ErrorContext(ctx, "InvoiceIssued parked", "message_id", m.ID, "event_id", d.ev.GetEventId(),
		"event_type", m.Attributes[pubsub.AttrEventType], "work_order_id", d.ev.GetWorkOrderId(), "reason", r.reason)
	return d.outcome, nil
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
		d := v.decoder.decode(&m)
		if d.outcome != "" {
			return fmt.Errorf("invoicing: parked message %d still invalid: %s", parkedID, d.reason)
		}
		var err error
		var reason string
		if outcome, reason, err = apply(ctx, tx, d.ev, m.Data); err != nil {
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
