package inbox

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/lossless-dev/lossless/pkg/pgtext"
)

// Before the insert: each received message made storable (or parked as
// poison with its reason), keyed, and turned into the insert's columns.

// poisonKeyPrefix keys an entry whose own event id is unusable.
const poisonKeyPrefix = "pubsub-message:"

// row is one message ready for the inbox: storable text, marshalled
// attributes, its payload hash and its position in the received batch.
type row struct {
	Message
	attrs    string
	sha      []byte
	receipt  int
	rejected bool
}

func (r row) key() rowKey { return rowKey{r.Source, r.EventID} }

// park returns the parked form of a row the database rejected for cause.
func (r row) park(cause string) row {
	p := r
	p.rejected = true
	prior := ""
	if r.ParkReason == "" {
		p.ParkReason = ReasonPoison
	} else {
		prior = r.ParkError + "; "
	}
	p.ParkError = pgtext.Storable(prior + "not storable as received: " + cause)
	return p
}

// prepare validates msgs, replaces each message PostgreSQL cannot store by
// its parked, escaped form, and sorts the batch by key (stable: copies of a
// key stay in receipt order).
func prepare(msgs []Message) ([]row, error) {
	rows := make([]row, len(msgs))
	for i, m := range msgs {
		if m.Source == "" || m.EventID == "" {
			return nil, fmt.Errorf("inbox: message %d has no source or event id (poison must be keyed by its message id)", i)
		}
		if pgtext.Problem(m.Source) != "" || utf8.RuneCountInString(m.Source) > MaxSourceLength {
			return nil, fmt.Errorf("inbox: message %d: source %q is not a storable name of at most %d characters", i, m.Source, MaxSourceLength)
		}
		r := row{receipt: i}
		if problems := unstorable(m); len(problems) > 0 {
			m = storable(m, problems)
			r.rejected = true
		}
		if m.Attributes == nil {
			m.Attributes = map[string]string{}
		}
		a, err := json.Marshal(m.Attributes)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(m.Payload)
		if m.Payload == nil {
			m.Payload = []byte{}
		}
		r.Message, r.attrs, r.sha = m, string(a), sum[:]
		rows[i] = r
	}
	sortRows(rows)
	return rows, nil
}

func sortRows(rs []row) {
	slices.SortStableFunc(rs, func(a, b row) int {
		return cmp.Or(strings.Compare(a.Source, b.Source), strings.Compare(a.EventID, b.EventID))
	})
}

// unstorable lists why PostgreSQL would reject m, one "field: problem" each.
func unstorable(m Message) []string {
	var problems []string
	check := func(field, s string) {
		if p := pgtext.Problem(s); p != "" {
			problems = append(problems, field+" "+p)
		}
	}
	check("event_id", m.EventID)
	if n := utf8.RuneCountInString(m.EventID); n > MaxEventIDLength {
		problems = append(problems, fmt.Sprintf("event_id has %d characters, more than %d", n, MaxEventIDLength))
	}
	check("event_type", m.EventType)
	check("correlation_key", m.CorrelationKey)
	check("message_id", m.MessageID)
	check("traceparent", m.Traceparent)
	check("tracestate", m.Tracestate)
	check("park_reason", m.ParkReason)
	check("park_error", m.ParkError)
	_, escaped := pgtext.StorableMap(m.Attributes)
	problems = append(problems, escaped...)
	return problems
}

// storable returns the parked form of m that PostgreSQL can store: text
// escaped, the key replaced by PoisonKey when the event id is unusable, no
// correlation key when it is unusable, and why in the park error.
func storable(m Message, problems []string) Message {
	p := m
	var notes []string
	if pgtext.Problem(m.EventID) != "" || utf8.RuneCountInString(m.EventID) > MaxEventIDLength {
		p.EventID = PoisonKey(m.MessageID)
		notes = append(notes, "keyed by message id")
	}
	if pgtext.Problem(m.CorrelationKey) != "" {
		p.CorrelationKey = ""
		notes = append(notes, "correlation key dropped")
	}
	p.EventType = pgtext.Storable(m.EventType)
	p.MessageID = pgtext.Storable(m.MessageID)
	p.Traceparent = pgtext.Storable(m.Traceparent)
	p.Tracestate = pgtext.Storable(m.Tracestate)
	p.Attributes, _ = pgtext.StorableMap(m.Attributes)
	notes = append(notes, `text escaped: NUL and invalid bytes as \xHH, backslash doubled`)
	prior := ""
	if m.ParkReason == "" {
		p.ParkReason = ReasonPoison
	} else {
		p.ParkReason = pgtext.Storable(m.ParkReason)
		prior = m.ParkError + "; "
	}
	p.ParkError = pgtext.Storable(prior + "not storable as received: " + strings.Join(problems, "; ") + " (" + strings.Join(notes, "; ") + ")")
	return p
}

// PoisonKey is the event id of an entry whose own event id is missing or
// unusable: "pubsub-message:<message id>", so that a redelivery of the same
// message still deduplicates. A message id that is not storable is escaped;
// one that would make the key too long is replaced by its SHA-256 (hex).
func PoisonKey(messageID string) string {
	k := poisonKeyPrefix + pgtext.Storable(messageID)
	if utf8.RuneCountInString(k) <= MaxEventIDLength {
		return k
	}
	sum := sha256.Sum256([]byte(messageID))
	return poisonKeyPrefix + "sha256:" + hex.EncodeToString(sum[:])
}

// columns is a batch in column-major form for unnest(), in key order.
type columns struct {
	source, eventID, eventType []string
	schemaVersion              []int32
	correlationKey             []*string
	payload, sha               [][]byte
	attrs, messageID           []string
	deliveryAttempt            []int32
	traceparent, tracestate    []string
	parkReason, parkError      []*string
	receipt                    []int32
}

func toColumns(rs []row) columns {
	var c columns
	for i := range rs {
		r := &rs[i]
		c.source = append(c.source, r.Source)
		c.eventID = append(c.eventID, r.EventID)
		c.eventType = append(c.eventType, r.EventType)
		c.schemaVersion = append(c.schemaVersion, int32(r.SchemaVersion))
		c.correlationKey = append(c.correlationKey, nullable(r.CorrelationKey))
		c.payload = append(c.payload, r.Payload)
		c.sha = append(c.sha, r.sha)
		c.attrs = append(c.attrs, r.attrs)
		c.messageID = append(c.messageID, r.MessageID)
		c.deliveryAttempt = append(c.deliveryAttempt, int32(r.DeliveryAttempt))
		c.traceparent = append(c.traceparent, r.Traceparent)
		c.tracestate = append(c.tracestate, r.Tracestate)
		var reason, perr *string
		if r.ParkReason != "" {
			reason, perr = &r.ParkReason, &r.ParkError
		}
		c.parkReason = append(c.parkReason, reason)
		c.parkError = append(c.parkError, perr)
		c.receipt = append(c.receipt, int32(r.receipt))
	}
	return c
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
