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
// until the dead-letter topic's retention ran out. The message is parked
// (pkg/parked, table parked_messages) with raw bytes and the reason, counted
// (workorder.invoicing.messages{outcome="parked"}) for the alarm, and replayed
// by an operator (Replay: ticket and actor required) through the same path.
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
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/dedup"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
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

// MaxEventIDLength is the longest event id the dedup marker stores.
const MaxEventIDLength = dedup.MaxEventIDLength

// Config of the consumer. The zero value of every field means its default.
type Config struct {
	// Subscription the messages come from, recorded with parked messages.
	// Default topology.SubBillingEvents.
	Subscription string
	// MaxPayloadBytes caps a message's payload: a larger one is parked
	// unparsed, with its raw bytes. Default DefaultMaxPayloadBytes; 1..10 MiB.
	MaxPayloadBytes int
	// Concurrency is how many messages the consumer applies at once, each in
	// its own transaction, across all the batches it is handed. Default
	// DefaultConcurrency; 1..64. Each holds a pooled connection while it
	// runs: keep it well below the pool's size.
	Concurrency int
}

// DefaultConcurrency is Config.Concurrency's default. One message at a time
// applied a pulled backlog at the speed of one commit after another; under
// load the INVOICED hop queued behind it for seconds (p99 0.8–4 s at half
// of capacity in B5), while billing published its events within 160 ms.
const DefaultConcurrency = 4

// maxConcurrency bounds Config.Concurrency: more would only wait for
// connections.
const maxConcurrency = 64

func (c *Config) setDefaults() {
	if c.Subscription == "" {
		c.Subscription = topology.SubBillingEvents
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
}

// Validate reports an unusable configuration; zero fields take their
// defaults.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.MaxPayloadBytes < 1 || c.MaxPayloadBytes > maxPayloadBytesLimit {
		errs = append(errs, fmt.Errorf("MaxPayloadBytes %d: want 1..%d", c.MaxPayloadBytes, maxPayloadBytesLimit))
	}
	if c.Concurrency < 1 || c.Concurrency > maxConcurrency {
		errs = append(errs, fmt.Errorf("Config.Concurrency %d: want 1..%d", c.Concurrency, maxConcurrency))
	}
	if p := pgtext.Problem(c.Subscription); p != "" {
		errs = append(errs, fmt.Errorf("Config.Subscription %q: %s", c.Subscription, p))
	}
	return errors.Join(errs...)
}

// Option configures New.
type Option func(*Invoicing)

// WithConfig sets the consumer's Config (default: the zero Config).
func WithConfig(cfg Config) Option { return func(v *Invoicing) { v.cfg = cfg } }

// WithParked sets where messages are parked and replayed from. Default: a
// parked.Store in the default schema, the one migrations.WorkOrder
// migrates.
func WithParked(s *parked.Store) Option { return func(v *Invoicing) { v.parked = s } }

// Invoicing applies InvoiceIssued events to work orders.
type Invoicing struct {
	pool     *pgxpool.Pool
	logger   *slog.Logger
	cfg      Config
	parked   *parked.Store
	decoder  decoder
	slots    chan struct{} // Config.Concurrency messages in flight at most
	outcomes metric.Int64Counter
	hops     *orderhop.Recorder
}

// New returns the consumer. Wire it in the workorder binary:
//
//	inv, _ := invoicing.New(pool, logger, meter, invoicing.WithConfig(cfg))
//	sub, _ := pubsub.NewSubscriber(client, topology.SubBillingEvents, cfg, logger, meter)
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
	v.slots = make(chan struct{}, v.cfg.Concurrency)
	if v.parked == nil {
		var err error
		if v.parked, err = parked.New(); err != nil {
			return nil, fmt.Errorf("invoicing: %w", err)
		}
	}
	if meter == nil {
		meter = noop.NewMeterProvider().Meter("")
	}
	var err error
	v.outcomes, err = meter.Int64Counter("workorder.invoicing.messages",
		metric.WithDescription("InvoiceIssued messages consumed, by outcome: invoiced, duplicate, parked, unknown_type (parked too). Alert on parked and unknown_type."))
	if err != nil {
		return nil, err
	}
	if v.hops, err = orderhop.New(meter); err != nil {
		return nil, err
	}
	// Every outcome's series exists at 0 from the start: the alerts read
	// increase() over it, which cannot see a series' first sample.
	for _, o := range []string{OutcomeInvoiced, OutcomeDuplicate, OutcomeParked, OutcomeUnknownType} {
		v.outcomes.Add(context.Background(), 0, metric.WithAttributes(attribute.String("outcome", o)))
	}
	return v, nil
}

// HandleBatch applies each message in its own transaction, up to
// Config.Concurrency at once (orders are independent; one parked message must
// not hold back the others, and one transaction per order keeps row locks
// short and never held across orders; two messages for one order serialise
// on its row lock and the dedup marker). nil entries are acked; an error
// (infrastructure failure) nacks for redelivery.
func (v *Invoicing) HandleBatch(ctx context.Context, ms []*pubsub.Received) []error {
	_, errs := v.Process(ctx, ms)
	return errs
}

// Process applies ms as HandleBatch does and also returns each message's
// outcome ("" where its error is not nil), for an operator's replay of dead
// letters to report.
func (v *Invoicing) Process(ctx context.Context, ms []*pubsub.Received) (outcomes []string, errs []error) {
	outcomes, errs = make([]string, len(ms)), make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		select {
		case v.slots <- struct{}{}:
		case <-ctx.Done():
			// Not started: nacked, redelivered.
			errs[i] = ctx.Err()
			continue
		}
		wg.Go(func() {
			defer func() { <-v.slots }()
			outcomes[i], errs[i] = v.process(ctx, m)
		})
	}
	wg.Wait()
	return outcomes, errs
}

// Handle applies one message: nil means durably handled (ack).
func (v *Invoicing) Handle(ctx context.Context, m *pubsub.Received) error {
	_, err := v.process(ctx, m)
	return err
}

func (v *Invoicing) process(ctx context.Context, m *pubsub.Received) (string, error) {
	outcome, err := v.handle(ctx, m)
	if err != nil {
		v.logger.ErrorContext(ctx, "applying InvoiceIssued failed; nacked for redelivery", "message_id", m.ID, "error", err)
		return "", err
	}
	v.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
	return outcome, nil
}

func (v *Invoicing) handle(ctx context.Context, m *pubsub.Received) (string, error) {
	d := v.decoder.decode(m)
	if d.outcome != "" {
		return v.park(ctx, m, d)
	}
	ev := d.ev
	// Isolated in a transaction of its own: refused by the order's state or by
	// the database (a rule the decoder does not know), it rolls back, marker
	// included, so that a replay can apply once the cause is fixed.
	var outcome string
	reason, err := parked.Isolate(ctx, v.pool, func(tx pgx.Tx) error {
		var reason string
		var err error
		outcome, reason, err = apply(ctx, tx, ev, m.Data)
		if err == nil && reason != "" {
			return parked.Refuse(reason)
		}
		return err
	})
	switch {
	case err != nil:
		return "", err
	case reason != "":
		return v.park(ctx, m, verdict{ev: ev, outcome: OutcomeParked, reason: reason})
	}
	if outcome == OutcomeInvoiced {
		v.hops.Observe(ctx, orderhop.Invoiced, orderhop.Time(ev.GetIssuedAt()), time.Now())
		v.logger.InfoContext(ctx, "work order invoiced", "work_order_id", ev.GetWorkOrderId(),
			"invoice_id", ev.GetInvoiceId(), "invoice_number", ev.GetInvoiceNumber())
	}
	return outcome, nil
}

// apply runs the marker and the effect in tx. A non-empty reason means the
// event cannot be applied (the caller rolls back and parks). The order is
// locked before it is read: of two concurrent applications only one
// invoices, the second waits for the lock and then sees INVOICED.
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
	var repo orders.Repository // in tx only: the zero Repository
	o, err := repo.Lock(ctx, tx, orderID)
	switch {
	case errors.Is(err, orders.ErrNotFound):
		return "", "unknown work order " + orderID.String(), nil
	case err != nil:
		return "", "", fmt.Errorf("invoicing: read order %s: %w", orderID, err)
	}
	res, err := o.Invoice(invoiceID, "billing:"+ev.GetInvoiceNumber())
	var second *orders.SecondInvoiceError
	switch {
	case errors.As(err, &second):
		current := second.Current
		if current == "" {
			current = "<nil>"
		}
		return "", fmt.Sprintf("order already %s with invoice %s, not %s: second invoice for one order (I3)",
			orders.StatusInvoiced, current, invoiceID), nil
	case errors.Is(err, orders.ErrIllegalTransition):
		return "", fmt.Sprintf("order is %s, not %s", o.Status, orders.StatusCompleted), nil
	case err != nil:
		return "", "", fmt.Errorf("invoicing: invoice order %s: %w", orderID, err)
	case res == orders.AlreadyInvoiced:
		return OutcomeDuplicate, "", nil // the same invoice, re-announced
	}
	if err := repo.Save(ctx, tx, &o); err != nil {
		return "", "", fmt.Errorf("invoicing: invoice order %s: %w", orderID, err)
	}
	return OutcomeInvoiced, "", nil
}

// park stores m with d's reason on its own (m's transaction, if any, rolled
// back) and returns d's outcome.
func (v *Invoicing) park(ctx context.Context, m *pubsub.Received, d verdict) (string, error) {
	st, err := v.parked.Park(ctx, v.pool, parkedMessage(v.cfg.Subscription, m, d))
	if err != nil {
		return "", fmt.Errorf("invoicing: %w", err)
	}
	v.logger.ErrorContext(ctx, "InvoiceIssued parked", "message_id", m.ID, "event_id", d.ev.GetEventId(),
		"event_type", m.Attributes[pubsub.AttrEventType], "work_order_id", d.ev.GetWorkOrderId(),
		"parked_id", st.ID, "reason", st.Reason)
	return d.outcome, nil
}

// ErrAuditRequired is returned by Replay without a ticket or an actor (I6).
var ErrAuditRequired = parked.ErrAuditRequired

// ErrStillRefused is returned by Replay when the parked message still
// cannot be applied; nothing changed.
var ErrStillRefused = errors.New("invoicing: parked message still refused")

// Replay applies a parked message through the normal path, after an operator
// fixed its cause, and records who replayed it under which ticket in the same
// transaction. It fails, changing nothing, when the event still cannot be
// applied.
func (v *Invoicing) Replay(ctx context.Context, parkedID int64, ticket, actor string) (outcome string, err error) {
	return v.ReplayIn(ctx, v.pool, parkedID, ticket, actor)
}

// ReplayIn is Replay in db: on a pool its own transaction, in the caller's
// transaction a savepoint (an operator's dry run rolls the caller's back).
func (v *Invoicing) ReplayIn(ctx context.Context, db pgdb.DB, parkedID int64, ticket, actor string) (outcome string, err error) {
	err = v.parked.Replay(ctx, db, parkedID, ticket, actor, func(ctx context.Context, tx pgx.Tx, p parked.Parked) error {
		if p.Subscription != v.cfg.Subscription {
			return fmt.Errorf("invoicing: parked message %d is from %s, not %s", parkedID, p.Subscription, v.cfg.Subscription)
		}
		m := pubsub.Received{ID: p.MessageID, Attributes: p.Attributes, Data: p.Data}
		d := v.decoder.decode(&m)
		if d.outcome != "" {
			return fmt.Errorf("%w: %d still invalid: %s", ErrStillRefused, parkedID, d.reason)
		}
		var err error
		var reason string
		if outcome, reason, err = apply(ctx, tx, d.ev, m.Data); err != nil {
			return err
		}
		if reason != "" {
			return fmt.Errorf("%w: %d still not applicable: %s", ErrStillRefused, parkedID, reason)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	v.logger.InfoContext(ctx, "parked InvoiceIssued replayed", "parked_id", parkedID, "ticket", ticket, "actor", actor, "outcome", outcome)
	return outcome, nil
}
