// Package receiver is the work-order service's Pub/Sub receiver for
// work-order-completed: receive, ONE batched insert into the inbox, ack after
// commit. Nothing else happens between receipt and ack (before the ack only
// what can fail technically).
//
// Isolation is per message: the decoder turns everything the database would
// refuse (NUL bytes, invalid UTF-8, over-long ids, oversized payloads) into
// poison, stored PARKED and acked, and the inbox store parks a message the
// database still rejects instead of failing its batch-mates. Only an
// infrastructure error (database unreachable, a timeout, a bug) nacks the
// whole batch; Pub/Sub redelivers it (F15).
package receiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/workorder/internal/correlation"
)

// DefaultMaxPayloadBytes is the default Config.MaxPayloadBytes: 1 MiB.
const DefaultMaxPayloadBytes = 1 << 20

// maxPubSubMessageBytes is the largest message Pub/Sub accepts; a larger cap
// would never apply.
const maxPubSubMessageBytes = 10 << 20

// Config tunes the decoding. The zero value of a field means its default.
type Config struct {
	// MaxPayloadBytes caps a message body. A larger body is not parsed: it
	// is stored as poison (raw bytes kept) with the reason "payload N bytes
	// exceeds the cap of M bytes". Default DefaultMaxPayloadBytes (1 MiB): a
	// valid WorkOrderCompleted is under 200 bytes, so only garbage or a
	// producer bug reaches it; at most Pub/Sub's 10 MB message limit.
	MaxPayloadBytes int
}

// ConfigFromEnv reads the decoding configuration with prefix (e.g.
// "WORKORDER_RECEIVER_"): MAX_PAYLOAD_BYTES.
func ConfigFromEnv(r *envconfig.Reader, prefix string) Config {
	return Config{MaxPayloadBytes: r.Int(prefix+"MAX_PAYLOAD_BYTES", DefaultMaxPayloadBytes)}
}

func (c *Config) setDefaults() {
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
}

// Validate reports an unusable configuration (zero fields take their
// defaults).
func (c Config) Validate() error {
	c.setDefaults()
	if c.MaxPayloadBytes < 1 || c.MaxPayloadBytes > maxPubSubMessageBytes {
		return fmt.Errorf("receiver: MaxPayloadBytes %d must be within 1..%d", c.MaxPayloadBytes, maxPubSubMessageBytes)
	}
	return nil
}

// Receiver stores every delivered message in the inbox.
type Receiver struct {
	store  *inbox.Store
	sub    *pubsub.Subscriber
	dec    *Decoder
	logger *slog.Logger
	opts   []Option
}

// Option configures a Receiver or Handle.
type Option func(*options)

type options struct {
	hops *orderhop.Recorder
}

// WithHops observes the deliver hop (the completion's Pub/Sub publish time →
// stored in the inbox) of every first delivery of a completion on r.
func WithHops(r *orderhop.Recorder) Option { return func(o *options) { o.hops = r } }

// New returns a receiver reading sub (topology.SubWorkOrderCompleted) into
// store, decoding with cfg.
func New(store *inbox.Store, sub *pubsub.Subscriber, cfg Config, logger *slog.Logger, opts ...Option) (*Receiver, error) {
	if store == nil || sub == nil || logger == nil {
		return nil, errors.New("receiver: New needs a store, a subscriber and a logger")
	}
	dec, err := NewDecoder(cfg)
	if err != nil {
		return nil, err
	}
	return &Receiver{store: store, sub: sub, dec: dec, logger: logger, opts: opts}, nil
}

// Run receives batches until ctx is cancelled.
func (r *Receiver) Run(ctx context.Context) error {
	return r.sub.RunBatch(ctx, Handle(r.store, r.dec, r.logger, r.opts...))
}

// Handle returns the batch handler: decode (pure CPU, cannot fail: an
// undecodable or unstorable message becomes a poison entry), one Ingest,
// then every message's result is the transaction's: all acked (each message
// stored, OPEN or PARKED) or, on an infrastructure error, all nacked.
func Handle(store *inbox.Store, dec *Decoder, logger *slog.Logger, opts ...Option) pubsub.BatchHandler {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return func(ctx context.Context, ms []*pubsub.Received) []error {
		msgs := make([]inbox.Message, len(ms))
		// Under the subscriber's consumer span (linked to each message's
		// producer) every entry keeps THAT span's context, so the inbox
		// relay links to the receipt, which links to the publish (ADR 0009).
		tp, ts := telemetry.TraceHeaders(ctx)
		for i, m := range ms {
			msgs[i] = dec.Decode(m)
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
		if res.WakeErr != nil {
			logger.WarnContext(ctx, "inbox receiver: stored, but waking the inbox relay failed; it finds the entries by polling", "error", res.WakeErr)
		}
		if res.Rejected > 0 {
			logger.ErrorContext(ctx, "inbox receiver: the database refused messages the decoder accepted; parked by the store (teach Decode the rule)",
				"rejected", res.Rejected)
		}
		stored := time.Now()
		for _, m := range ms {
			// A redelivery's publish time is the first delivery's: only first
			// deliveries measure the hop.
			if m.DeliveryAttempt <= 1 && m.Attributes[pubsub.AttrEventType] == correlation.TypeCompleted {
				o.hops.Observe(ctx, orderhop.Deliver, m.PublishTime, stored)
			}
		}
		return errs
	}
}

// Decoder turns deliveries into inbox messages.
type Decoder struct {
	maxPayload int
}

// NewDecoder returns a Decoder for cfg (zero fields: defaults).
func NewDecoder(cfg Config) (*Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Decoder{maxPayload: cfg.MaxPayloadBytes}, nil
}

// Decode turns a delivery into an inbox message that the inbox table can
// store. Validation failures produce a message with ParkReason POISON and
// a ParkError naming the rule: stored with its raw bytes and attributes,
// acked, never retried. The rules: payload within the size cap; attributes
// storable (no NUL byte, valid UTF-8; else stored escaped, see
// pgtext.StorableMap); schema_version an integer; the payload parses
// and validates (F9: unknown schema_version or event_type, missing ids, an
// event_id over inbox.MaxEventIDLength); the event_id storable; the
// event_id attribute, when present, equal to the payload's.
func (d *Decoder) Decode(m *pubsub.Received) inbox.Message {
	attrs, escaped := pgtext.StorableMap(m.Attributes)
	msg := inbox.Message{
		Source:          correlation.Source,
		EventType:       attrs[pubsub.AttrEventType],
		Payload:         m.Data,
		Attributes:      attrs,
		MessageID:       pgtext.Storable(m.ID),
		DeliveryAttempt: m.DeliveryAttempt,
		Traceparent:     attrs[pubsub.AttrTraceparent],
		Tracestate:      attrs[pubsub.AttrTracestate],
	}
	err := d.validate(m, escaped, &msg)
	if err == nil {
		return msg
	}
	// Poison. Keyed by the claimed event id if it is usable (a later valid
	// message under it then shows up as a conflict, which it is), else by
	// the message id, so a redelivery of the same poison still dedups.
	msg.ParkReason, msg.ParkError = inbox.ReasonPoison, pgtext.Storable(err.Error())
	msg.EventID, msg.CorrelationKey = m.Attributes[pubsub.AttrEventID], ""
	if msg.EventID == "" || len(msg.EventID) > inbox.MaxEventIDLength || pgtext.Problem(msg.EventID) != "" {
		msg.EventID = inbox.PoisonKey(m.ID)
	}
	if u, uerr := uuid.Parse(m.OrderingKey); uerr == nil {
		msg.CorrelationKey = u.String()
	}
	return msg
}

// validate applies Decode's rules in order and, when they pass, sets the
// message's schema version, event id and correlation key.
func (d *Decoder) validate(m *pubsub.Received, escaped []string, msg *inbox.Message) error {
	if len(m.Data) > d.maxPayload {
		return fmt.Errorf("%w: payload %d bytes exceeds the cap of %d bytes", correlation.ErrInvalid, len(m.Data), d.maxPayload)
	}
	if len(escaped) > 0 {
		return fmt.Errorf("%w: attributes not storable (kept escaped): %v", correlation.ErrInvalid, escaped)
	}
	version, err := strconv.Atoi(m.Attributes[pubsub.AttrSchemaVersion])
	if err != nil {
		return errors.Join(correlation.ErrInvalid, errors.New("schema_version attribute missing or not an integer"))
	}
	msg.SchemaVersion = version
	ev, err := correlation.Parse(msg.EventType, version, m.Data)
	if err != nil {
		return err
	}
	if p := pgtext.Problem(ev.EventID); p != "" {
		return fmt.Errorf("%w: event_id %q %s", correlation.ErrInvalid, ev.EventID, p)
	}
	if id := m.Attributes[pubsub.AttrEventID]; id != "" && id != ev.EventID {
		return errors.Join(correlation.ErrInvalid, errors.New("event_id attribute differs from the payload's event_id"))
	}
	msg.EventID, msg.CorrelationKey = ev.EventID, ev.OrderID.String()
	return nil
}
