package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/lossless-dev/lossless/pkg/envelope"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// Outcomes of one message the skeleton decides itself; Handler.Apply adds
// its own (the effect it had).
const (
	// OutcomeDuplicate: the event's marker exists; nothing applied.
	OutcomeDuplicate = "duplicate"
	// OutcomeParked: refused by the decoder, by Apply (a permanent error),
	// by the database (pgdb.IsData), or an event id reused with other
	// content; parked with the reason.
	OutcomeParked = "parked"
	// OutcomeUnknownType: an event type this consumer does not read, parked
	// like any other message it cannot process and counted apart: a
	// producer publishes something this consumer was not built for.
	OutcomeUnknownType = "unknown_type"
)

// DefaultMaxPayloadBytes is Config.MaxPayloadBytes's default: 1 MiB. An
// event is a few hundred bytes; Pub/Sub allows up to 10 MB.
const DefaultMaxPayloadBytes = 1 << 20

// maxPayloadBytesLimit is Pub/Sub's own message size limit: a cap above it
// would never apply.
const maxPayloadBytesLimit = 10 << 20

// DefaultConcurrency is Config.Concurrency's default.
const DefaultConcurrency = 4

// maxConcurrency bounds Config.Concurrency: more would only wait for
// connections.
const maxConcurrency = 64

// Config of a consumer. The zero value of a field means its default.
type Config struct {
	// Subscription the messages come from, recorded with each parked
	// message; Replay refuses a parked row of another. Required.
	Subscription string
	// MaxPayloadBytes caps a message's payload: a larger one is parked
	// unparsed, with its raw bytes. Default DefaultMaxPayloadBytes; 1..10 MiB.
	MaxPayloadBytes int
	// Concurrency is how many messages the per-message fallback applies at
	// once, each in a transaction of its own, when a batch's transaction
	// failed. Each holds a pooled connection while it runs: keep it well
	// below the pool's size. Default DefaultConcurrency; 1..64.
	Concurrency int
}

func (c *Config) setDefaults() {
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
}

// Validate reports an unusable configuration; errors name the field. Zero
// fields take their defaults.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.Subscription == "" {
		errs = append(errs, errors.New("Config.Subscription: required"))
	} else if p := pgtext.Problem(c.Subscription); p != "" {
		errs = append(errs, fmt.Errorf("Config.Subscription %q: %s", c.Subscription, p))
	}
	return errors.Join(append(errs, c.validateTunables())...)
}

// Settings are the part of Config a service configures: the consumer's own
// package fixes its subscription (For), so a service's configuration holds
// these alone. The zero value of every field means its default.
type Settings struct {
	// MaxPayloadBytes is Config.MaxPayloadBytes.
	MaxPayloadBytes int
	// Concurrency is Config.Concurrency.
	Concurrency int
}

// For is the Config of a consumer of subscription, tuned by s.
func (s Settings) For(subscription string) Config {
	return Config{Subscription: subscription, MaxPayloadBytes: s.MaxPayloadBytes, Concurrency: s.Concurrency}
}

// Validate reports unusable settings, naming the field; zero fields take
// their defaults.
func (s Settings) Validate() error {
	c := s.For("")
	c.setDefaults()
	return c.validateTunables()
}

func (c Config) validateTunables() error {
	var errs []error
	if c.MaxPayloadBytes < 1 || c.MaxPayloadBytes > maxPayloadBytesLimit {
		errs = append(errs, fmt.Errorf("MaxPayloadBytes %d: want 1..%d", c.MaxPayloadBytes, maxPayloadBytesLimit))
	}
	if c.Concurrency < 1 || c.Concurrency > maxConcurrency {
		errs = append(errs, fmt.Errorf("Config.Concurrency %d: want 1..%d", c.Concurrency, maxConcurrency))
	}
	return errors.Join(errs...)
}

// Handler is what a service supplies: how to read its event and what
// applying it does. T is the event's generated protobuf message.
type Handler[T envelope.Event] struct {
	// Name scopes the markers (processed_events.consumer), e.g.
	// "billing.invoicing". Required; renaming it re-enables every event.
	Name string
	// EventType is the event_type attribute read, and recorded with each
	// marker. Default: T's full protobuf name, what publishers set.
	EventType string
	// Decode turns a message into a verdict, pure and without the
	// database: envelope.Decode(m, env, rules) with the service's rules.
	// env carries Handler.EventType, Config.MaxPayloadBytes and
	// MaxEventIDLength. Required.
	Decode func(m *pubsub.Received, env envelope.Config) envelope.Verdict[T]
	// Apply applies an accepted event in tx, after its marker was claimed
	// in tx, and returns the outcome to count. A permanent error
	// (pkg/retry) refuses the event: its effects and its marker roll
	// back and it is parked with the error's text. Any other error nacks.
	// Required.
	Apply func(ctx context.Context, tx pgx.Tx, ev T, m *pubsub.Received) (outcome string, err error)
	// Subject is what an event is about in the service's terms (a work
	// order id), stored with a parked message; ev may be nil. Optional.
	Subject func(ev T) string
	// Messages counts messages by outcome (attribute "outcome"), once
	// committed: the service names it (meter.Int64Counter) and alerts on
	// OutcomeParked and OutcomeUnknownType. Optional.
	Messages metric.Int64Counter
	// Outcomes lists Apply's outcomes, so that every series of Messages
	// exists at 0 from the start (alerts read increase() over it, which
	// cannot see a series' first sample).
	Outcomes []string
	// Committed is called after the commit of each applied event (not a
	// duplicate or a parked one): a metric, a log line. Optional.
	Committed func(ctx context.Context, ev T, outcome string)
}

// Consumer is one idempotent consumer: decode, claim, apply, park, ack.
type Consumer[T envelope.Event] struct {
	db       pgdb.DB
	h        Handler[T]
	cfg      Config
	env      envelope.Config
	markers  *Markers
	parked   *parked.Store
	logger   *slog.Logger
	outcomes metric.Int64Counter
	slots    chan struct{} // Config.Concurrency fallback transactions at most
}

// New returns a consumer of h's events that runs its transactions on db (a
// pool). Of the options it uses WithSchema (where processed_events is) and
// WithParked.
func New[T envelope.Event](db pgdb.DB, h Handler[T], cfg Config, logger *slog.Logger, opts ...Option) (*Consumer[T], error) {
	if db == nil || logger == nil {
		return nil, errors.New("consumer: nil database handle or logger")
	}
	if h.Name == "" || h.Decode == nil || h.Apply == nil {
		return nil, errors.New("consumer: Handler.Name, Handler.Decode and Handler.Apply are required")
	}
	if h.EventType == "" {
		var zero T
		h.EventType = string(zero.ProtoReflect().Descriptor().FullName())
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("consumer %s: %w", h.Name, err)
	}
	o, err := optionsOf(opts)
	if err != nil {
		return nil, err
	}
	markers, err := NewMarkers(WithSchema(o.schema))
	if err != nil {
		return nil, err
	}
	if o.parked == nil {
		if o.parked, err = parked.New(parked.WithSchema(o.schema)); err != nil {
			return nil, fmt.Errorf("consumer: %w", err)
		}
	}
	outcomes := h.Messages
	if outcomes == nil {
		outcomes = noop.Int64Counter{}
	}
	for _, out := range append([]string{OutcomeDuplicate, OutcomeParked, OutcomeUnknownType}, h.Outcomes...) {
		outcomes.Add(context.Background(), 0, metric.WithAttributes(attribute.String("outcome", out)))
	}
	return &Consumer[T]{db: db, h: h, cfg: cfg, markers: markers, parked: o.parked, logger: logger, outcomes: outcomes,
		env:   envelope.Config{EventType: h.EventType, MaxPayloadBytes: cfg.MaxPayloadBytes, MaxEventIDLength: MaxEventIDLength},
		slots: make(chan struct{}, cfg.Concurrency)}, nil
}

// Handle consumes one message: nil means durably handled (ack).
func (c *Consumer[T]) Handle(ctx context.Context, m *pubsub.Received) error {
	return c.HandleBatch(ctx, []*pubsub.Received{m})[0]
}

// HandleBatch is a pubsub.BatchHandler: nil entries ack, errors nack.
func (c *Consumer[T]) HandleBatch(ctx context.Context, ms []*pubsub.Received) []error {
	_, errs := c.Process(ctx, ms)
	return errs
}

// Process consumes ms in one transaction, a savepoint per message, and
// returns each message's outcome ("" where its error is not nil), for an
// operator's replay of dead letters to report. When that transaction fails
// (anything a savepoint does not isolate: a deadlock with another batch, a
// lost connection, a timeout), each message is applied again in a
// transaction of its own, Config.Concurrency at once: only the messages
// that fail again nack.
func (c *Consumer[T]) Process(ctx context.Context, ms []*pubsub.Received) ([]string, []error) {
	vs := make([]envelope.Verdict[T], len(ms))
	for i, m := range ms {
		vs[i] = c.h.Decode(m, c.env)
	}
	outcomes, errs := make([]string, len(ms)), make([]error, len(ms))
	out, err := c.commit(ctx, ms, vs)
	switch {
	case err == nil:
		copy(outcomes, out)
	case len(ms) == 1:
		errs[0] = err
	default:
		c.logger.WarnContext(ctx, "batch transaction failed; applying its messages one transaction each",
			"consumer", c.h.Name, "messages", len(ms), "error", err)
		c.each(ctx, ms, vs, outcomes, errs)
	}
	for i, o := range outcomes {
		if errs[i] != nil {
			c.logger.ErrorContext(ctx, "consuming a message failed; nacked for redelivery",
				"consumer", c.h.Name, "message_id", ms[i].ID, "error", errs[i])
			continue
		}
		c.outcomes.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", o)))
		if c.h.Committed != nil && o != OutcomeDuplicate && o != OutcomeParked && o != OutcomeUnknownType {
			c.h.Committed(ctx, vs[i].Event, o)
		}
	}
	return outcomes, errs
}

// each is the per-message fallback: every message in a transaction of its
// own, Config.Concurrency at once.
func (c *Consumer[T]) each(ctx context.Context, ms []*pubsub.Received, vs []envelope.Verdict[T], outcomes []string, errs []error) {
	var wg sync.WaitGroup
	for i := range ms {
		select {
		case c.slots <- struct{}{}:
		case <-ctx.Done():
			errs[i] = ctx.Err() // not started: nacked, redelivered
			continue
		}
		wg.Go(func() {
			defer func() { <-c.slots }()
			out, err := c.commit(ctx, ms[i:i+1], vs[i:i+1])
			if err != nil {
				errs[i] = err
				return
			}
			outcomes[i] = out[0]
		})
	}
	wg.Wait()
}

// errConflict refuses an event id reused with other content.
var errConflict = retry.Permanent(errors.New("event id already processed with different content (producer bug)"))

// marker is ev's marker for this consumer.
func (c *Consumer[T]) marker(m *pubsub.Received, ev T) Marker {
	return Marker{Consumer: c.h.Name, ID: ev.GetEventId(), Type: c.h.EventType, Payload: m.Data}
}

// apply claims ev's marker in tx and, when it is new, applies ev.
func (c *Consumer[T]) apply(ctx context.Context, tx pgx.Tx, m *pubsub.Received, ev T) (string, error) {
	batch := &pgx.Batch{}
	cl, err := c.markers.queueClaim(batch, c.marker(m, ev))
	if err != nil {
		return "", err
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return "", err
	}
	return c.applyClaimed(ctx, tx, cl, m, ev)
}

// applyClaimed applies ev when its sent claim won.
func (c *Consumer[T]) applyClaimed(ctx context.Context, tx pgx.Tx, cl *claim, m *pubsub.Received, ev T) (string, error) {
	out, err := cl.outcome(ctx, tx)
	switch {
	case err != nil:
		return "", err
	case out == Duplicate:
		c.logger.DebugContext(ctx, "duplicate delivery; nothing to do", "consumer", c.h.Name,
			"event_id", ev.GetEventId(), "message_id", m.ID)
		return OutcomeDuplicate, nil
	case out == Conflict:
		c.logger.ErrorContext(ctx, "event id reused with different content: producer bug", "consumer", c.h.Name,
			"event_id", ev.GetEventId(), "message_id", m.ID)
		return "", errConflict
	}
	return c.h.Apply(ctx, tx, ev, m)
}

// park stores m with reason in tx and returns outcome.
func (c *Consumer[T]) park(ctx context.Context, tx pgx.Tx, m *pubsub.Received, ev T, outcome, reason string) (string, error) {
	var subject string
	if c.h.Subject != nil {
		subject = c.h.Subject(ev)
	}
	st, err := c.parked.Park(ctx, tx, envelope.Parked(c.cfg.Subscription, m, ev, subject, reason))
	if err != nil {
		return "", fmt.Errorf("consumer %s: %w", c.h.Name, err)
	}
	msg := "message parked"
	if outcome == OutcomeUnknownType {
		msg = "event type not consumed here; message parked"
	}
	c.logger.ErrorContext(ctx, msg, "consumer", c.h.Name, "message_id", m.ID, "event_id", ev.GetEventId(),
		"event_type", m.Attributes[pubsub.AttrEventType], "subject", subject, "parked_id", st.ID, "reason", st.Reason)
	return outcome, nil
}

// ErrStillRefused is returned by Replay when the parked message still
// cannot be applied; the row stays open.
var ErrStillRefused = errors.New("consumer: parked message still refused")

// ErrAuditRequired is returned by Replay without a ticket or an actor (I6).
var ErrAuditRequired = parked.ErrAuditRequired

// Replay consumes the open parked message parkedID through the normal path
// (decoder, marker, Apply), once an operator fixed its cause (a payload cap
// raised, a rule relaxed by a deploy, the state it needed repaired), and
// marks it replayed by actor under ticket in the same transaction: a
// transaction of its own on a pool, a savepoint when db is the caller's
// transaction (an operator's dry run rolls the caller's back). When the
// message is still refused nothing changes and the error wraps
// ErrStillRefused with the reason; a second Replay of the row finds it
// closed (parked.ErrNotOpen).
func (c *Consumer[T]) Replay(ctx context.Context, db pgdb.DB, parkedID int64, ticket, actor string) (outcome string, err error) {
	err = c.parked.Replay(ctx, db, parkedID, ticket, actor, func(ctx context.Context, tx pgx.Tx, p parked.Parked) error {
		if p.Subscription != c.cfg.Subscription {
			return fmt.Errorf("consumer: parked message %d is from %s, not %s", parkedID, p.Subscription, c.cfg.Subscription)
		}
		m := &pubsub.Received{ID: p.MessageID, Attributes: p.Attributes, Data: p.Data}
		v := c.h.Decode(m, c.env)
		if !v.Accepted() {
			return fmt.Errorf("%w: %d: %s", ErrStillRefused, parkedID, v.Reason())
		}
		var err error
		outcome, err = c.apply(ctx, tx, m, v.Event)
		if retry.IsPermanent(err) || pgdb.IsData(err) {
			return fmt.Errorf("%w: %d: %w", ErrStillRefused, parkedID, err)
		}
		return err
	})
	if err != nil {
		return "", err
	}
	c.logger.InfoContext(ctx, "parked message replayed", "consumer", c.h.Name, "parked_id", parkedID,
		"ticket", ticket, "actor", actor, "outcome", outcome)
	return outcome, nil
}
