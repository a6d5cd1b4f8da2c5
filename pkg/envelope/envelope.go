// Package envelope applies the rules every event message obeys before a
// consumer reads what the event says: its event_type, schema_version and
// event_id attributes (pkg/pubsub), the size of its payload, and the payload
// as the protobuf message of that type.
//
// A consumer decodes each message with Decode, passing its own rules for
// the event's fields, and parks what Decode refuses (pkg/parked, Parked)
// with the reasons it gives. Decode is pure: the same message gets the same
// verdict, and it never touches the database. It refuses whatever
// PostgreSQL would refuse of the attributes and fields a consumer stores
// (pkg/pgtext) and event ids longer than the event_id columns hold, so that
// such a message is parked with the rule it broke instead of failing a
// statement, and with it its whole batch.
//
// Lesson: decide a message's fate from the message alone, before any
// statement runs, so that one bad message is parked with a readable reason and
// never takes its batch-mates down with it (ADR 0010). Guards H2 (bytes the
// database refuses, over-long event ids), H3 (a payload over the cap, refused
// unparsed) and H5 (an event type the consumer does not read), and so the
// classification half of I5: a refused message is a business rejection to
// park, never a technical failure to retry.
package envelope

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// Event is a generated protobuf event message (a pointer) carrying its own
// id in an event_id field.
type Event interface {
	proto.Message
	GetEventId() string
}

// Config is what a consumer reads: one event type, at one schema version,
// within its limits.
type Config struct {
	// EventType is the event_type attribute of the messages the consumer
	// reads. Default: the full name of the event's protobuf message, which
	// is what publishers set (pkg/pubsub).
	EventType string
	// MaxPayloadBytes caps the payload. Default 10 MiB: Pub/Sub's own
	// message size limit, so a consumer that sets none refuses nothing for
	// its size.
	MaxPayloadBytes int
	// MaxEventIDLength is the longest event id accepted, in characters.
	// Default 200: the CHECK limit of the event_id columns of pkg/consumer and
	// pkg/inbox, where consumers record the events they processed.
	MaxEventIDLength int
	// SchemaVersion is the schema_version attribute the consumer reads; a
	// message without the attribute is read as this version. Default "1",
	// the version publishers set (pkg/pubsub).
	SchemaVersion string
}

func (c *Config) setDefaults() {
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = 10 << 20
	}
	if c.MaxEventIDLength == 0 {
		c.MaxEventIDLength = 200
	}
	if c.SchemaVersion == "" {
		c.SchemaVersion = "1"
	}
}

// Validate checks c, its zero fields read as their defaults. Decode does
// not call it (it has no error to return): a consumer validates its Config
// once, where it builds it.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.MaxPayloadBytes < 1 {
		errs = append(errs, fmt.Errorf("envelope: MaxPayloadBytes %d: want at least 1", c.MaxPayloadBytes))
	}
	if c.MaxEventIDLength < 1 {
		errs = append(errs, fmt.Errorf("envelope: MaxEventIDLength %d: want at least 1", c.MaxEventIDLength))
	}
	if p := pgtext.Problem(c.EventType); p != "" {
		errs = append(errs, fmt.Errorf("envelope: EventType %s", p))
	}
	if p := pgtext.Problem(c.SchemaVersion); p != "" {
		errs = append(errs, fmt.Errorf("envelope: SchemaVersion %s", p))
	}
	return errors.Join(errs...)
}

// Verdict is what Decode decided about one message.
type Verdict[T Event] struct {
	// Event is the payload, parsed: set whenever it parsed, refused or not,
	// so that a parked message keeps its event id; nil when the message was
	// refused before (event type, size, schema version) or did not parse.
	Event T
	// UnknownType: the message is an event of another type than the
	// consumer reads (a routing error upstream, not a bad message). It is
	// refused too, Reasons saying which type it is.
	UnknownType bool
	// Reasons the message is refused, in the order found; none when it is
	// accepted.
	Reasons []string
}

// Accepted reports whether the consumer may apply v.Event.
func (v Verdict[T]) Accepted() bool { return len(v.Reasons) == 0 }

// Outcome names v among a consumer's outcomes (its metrics' labels): ""
// when v is accepted, unknownType for an event of another type, refused for
// any other refusal.
func (v Verdict[T]) Outcome(refused, unknownType string) string {
	switch {
	case v.UnknownType:
		return unknownType
	case !v.Accepted():
		return refused
	}
	return ""
}

// Reason is why the message is refused, the reasons joined with "; "; ""
// when it is accepted.
func (v Verdict[T]) Reason() string { return strings.Join(v.Reasons, "; ") }

// Decode checks m against cfg, in this order: the event type (missing:
// refused; another type: UnknownType, and nothing else is checked); every
// attribute storable as text; the payload within cfg.MaxPayloadBytes; the
// schema version; the payload parsed as a T; every text field of it
// storable; its event id present, within cfg.MaxEventIDLength characters and
// equal to the event_id attribute when there is one; then rules, the
// consumer's own checks of a parsed event (nil for none). Reasons
// accumulate, except that a payload too large, of another schema version or
// unparseable is not read further.
//
// Decode does not validate cfg (see Config.Validate); its zero fields read
// as their defaults.
func Decode[T Event](m *pubsub.Received, cfg Config, rules func(T) []string) Verdict[T] {
	var zero T
	cfg.setDefaults()
	if cfg.EventType == "" {
		cfg.EventType = string(zero.ProtoReflect().Descriptor().FullName())
	}
	switch t := m.Attributes[pubsub.AttrEventType]; {
	case t == "":
		return Verdict[T]{Reasons: []string{"missing attribute " + pubsub.AttrEventType}}
	case t != cfg.EventType:
		return Verdict[T]{UnknownType: true,
			Reasons: []string{fmt.Sprintf("unknown event type %q (this consumer reads %s)", t, cfg.EventType)}}
	}
	reasons := pgtext.MapProblems(m.Attributes)
	refuse := func(reason string) Verdict[T] { return Verdict[T]{Reasons: append(reasons, reason)} }
	if len(m.Data) > cfg.MaxPayloadBytes {
		return refuse(fmt.Sprintf("payload %d bytes exceeds the cap of %d bytes", len(m.Data), cfg.MaxPayloadBytes))
	}
	if v := m.Attributes[pubsub.AttrSchemaVersion]; v != "" && v != cfg.SchemaVersion {
		return refuse("unsupported schema_version " + pgtext.Storable(v) + " (this consumer reads " + cfg.SchemaVersion + ")")
	}
	// A nil generated message still knows its type: this is a new, empty T.
	ev := zero.ProtoReflect().Type().New().Interface().(T)
	if err := proto.Unmarshal(m.Data, ev); err != nil {
		return refuse("unparseable payload: " + err.Error())
	}
	reasons = append(reasons, pgtext.MessageProblems(ev.ProtoReflect())...)
	switch id, attr := ev.GetEventId(), m.Attributes[pubsub.AttrEventID]; {
	case id == "":
		reasons = append(reasons, "event_id: missing")
	case utf8.RuneCountInString(id) > cfg.MaxEventIDLength:
		reasons = append(reasons, fmt.Sprintf("event_id: %d characters, limit %d", utf8.RuneCountInString(id), cfg.MaxEventIDLength))
	case attr != "" && attr != id:
		reasons = append(reasons, fmt.Sprintf("event_id %q differs from attribute event_id %q", id, attr))
	}
	if rules != nil {
		reasons = append(reasons, rules(ev)...)
	}
	return Verdict[T]{Event: ev, Reasons: reasons}
}

// Parked is m as pkg/parked keeps it, refused from subscription with
// reason: all it arrived with, the id of ev (nil when it did not parse) and
// subject, what it is about in the consumer's terms. parked.Store.Park makes
// every value storable.
func Parked[T Event](subscription string, m *pubsub.Received, ev T, subject, reason string) parked.Message {
	return parked.Message{Subscription: subscription, MessageID: m.ID, EventID: ev.GetEventId(),
		EventType: m.Attributes[pubsub.AttrEventType], Subject: subject,
		Attributes: m.Attributes, Data: m.Data, Reason: reason}
}
