package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgnotify"
)

// Header keys written by NewEvent and carried by the dispatcher as message
// attributes.
const (
	HeaderCorrelationID = "correlation_id"
	HeaderTraceparent   = "traceparent"
	HeaderTracestate    = "tracestate"
)

// Event is one outbox row.
type Event struct {
	ID            uuid.UUID         // event_id; becomes the message id downstream (dedup key)
	AggregateType string            // e.g. "work_order"
	AggregateID   string            // ordering key: events of one aggregate dispatch in order
	Type          string            // event_type: the proto full name, e.g. "lossless.events.v1.WorkOrderHandOffRequested"
	SchemaVersion int               // version of the payload's schema; default 1
	Payload       []byte            // protobuf binary of the event message
	Headers       map[string]string // "correlation_id", "traceparent", "tracestate"
	OccurredAt    time.Time         // business time (distinct from created_at)
	Attempts      int               // filled by the relay: dispatch attempts so far, including this one
}

// NewEvent builds an Event from a proto message: a new UUIDv7 id, Type = the
// message's full proto name, Payload = proto.Marshal(msg), SchemaVersion 1,
// OccurredAt = now, and Headers carrying the W3C trace context of ctx (when a
// span is active) so the consumer can link its span to the producer's.
// Callers may overwrite ID (e.g. with an id the message already carries) and
// OccurredAt (business time) before Append.
func NewEvent(ctx context.Context, aggregateType, aggregateID string, msg proto.Message) (Event, error) {
	if msg == nil {
		return Event{}, errors.New("outbox: nil message")
	}
	id, err := uuid.NewV7()
	if err != nil {
		return Event{}, fmt.Errorf("outbox: new event id: %w", err)
	}
	payload, err := proto.Marshal(msg)
	if err != nil {
		return Event{}, fmt.Errorf("outbox: marshal %s: %w", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	// The W3C propagator is used explicitly rather than the global one, so the
	// headers do not depend on process-wide configuration.
	headers := map[string]string{}
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(headers))
	return Event{
		ID:            id,
		AggregateType: aggregateType,
		AggregateID:   aggregateID,
		Type:          string(msg.ProtoReflect().Descriptor().FullName()),
		SchemaVersion: 1,
		Payload:       payload,
		Headers:       headers,
		OccurredAt:    time.Now().UTC(),
	}, nil
}

func (ev Event) validate() error {
	switch {
	case ev.ID == uuid.Nil:
		return errors.New("outbox: event without ID")
	case ev.AggregateType == "" || ev.AggregateID == "":
		return fmt.Errorf("outbox: event %s without aggregate type or id", ev.ID)
	case ev.Type == "":
		return fmt.Errorf("outbox: event %s without type", ev.ID)
	case ev.SchemaVersion < 1:
		return fmt.Errorf("outbox: event %s: schema version %d < 1", ev.ID, ev.SchemaVersion)
	case ev.OccurredAt.IsZero():
		return fmt.Errorf("outbox: event %s without OccurredAt", ev.ID)
	}
	return nil
}

// Writer appends events to the outbox of one schema. Build it once
// (NewWriter) and share it: it holds only its rendered statement. The zero
// Writer writes to DefaultSchema.
type Writer struct {
	insert  string // qAppend rendered for the schema; "" means qAppendDefault
	channel string // notifyChannel rendered for the schema; "" means notifyChannelDefault
}

// NewWriter returns a Writer for the outbox in the schema named by
// WithSchema (default DefaultSchema): pass it the options of the schema's
// relay. It ignores the relay's other options.
func NewWriter(opts ...Option) (Writer, error) {
	o, err := newOptions(opts)
	if err != nil {
		return Writer{}, err
	}
	return Writer{insert: pgmigrate.Render(qAppend, o.schema), channel: pgmigrate.Render(notifyChannel, o.schema)}, nil
}

// Append inserts evs into the outbox in DefaultSchema; see Writer.Append.
func Append(ctx context.Context, tx pgx.Tx, evs ...Event) error {
	return Writer{}.Append(ctx, tx, evs...)
}

// Append inserts evs in the caller's transaction (the business transaction),
// so the events exist if and only if the business change commits (I1). All
// events go in one INSERT, announced by one notification that wakes the
// relays (pgnotify.Notify): run the transaction as a pgdb.Tx (pgdb.InTx),
// which sends it after the commit, or it is sent inside the transaction, whose
// commit then holds PostgreSQL's global NOTIFY lock across its flush. It takes a
// pgx.Tx, not a connection: an event appended outside the business
// transaction would lose that guarantee.
func (w Writer) Append(ctx context.Context, tx pgx.Tx, evs ...Event) error {
	if len(evs) == 0 {
		return nil
	}
	return w.AppendWith(ctx, tx, nil, evs...)
}

// AppendWith is Append for a caller that counts its round trips: the
// insert is queued after b's statements (the business change, say), all of
// them go in one round trip, and b's first error is returned. b may be nil;
// evs may not be empty.
func (w Writer) AppendWith(ctx context.Context, tx pgx.Tx, b *pgx.Batch, evs ...Event) error {
	if tx == nil {
		return errors.New("outbox: Append needs the business transaction")
	}
	args, err := appendArgs(evs)
	if err != nil {
		return err
	}
	if b == nil {
		b = &pgx.Batch{}
	}
	var lowest int64
	b.Queue(cmp.Or(w.insert, qAppendDefault), args...).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&lowest); err != nil {
			return fmt.Errorf("outbox: append %d event(s): %w", len(evs), err)
		}
		return nil
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	return pgnotify.Notify(ctx, tx, pgnotify.Notification{Channel: cmp.Or(w.channel, notifyChannelDefault), Payload: strconv.FormatInt(lowest, 10)})
}

// appendArgs are qAppend's arguments for evs: one array per column.
func appendArgs(evs []Event) ([]any, error) {
	n := len(evs)
	if n == 0 {
		return nil, errors.New("outbox: no events to append")
	}
	ids := make([]uuid.UUID, n)
	aggTypes := make([]string, n)
	aggIDs := make([]string, n)
	types := make([]string, n)
	versions := make([]int32, n)
	payloads := make([][]byte, n)
	headers := make([]string, n)
	occurred := make([]time.Time, n)
	for i, ev := range evs {
		if err := ev.validate(); err != nil {
			return nil, err
		}
		h := ev.Headers
		if h == nil {
			h = map[string]string{}
		}
		hj, err := json.Marshal(h)
		if err != nil {
			return nil, fmt.Errorf("outbox: encode headers of %s: %w", ev.ID, err)
		}
		ids[i], aggTypes[i], aggIDs[i], types[i] = ev.ID, ev.AggregateType, ev.AggregateID, ev.Type
		versions[i], payloads[i], headers[i], occurred[i] = int32(ev.SchemaVersion), ev.Payload, string(hj), ev.OccurredAt
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
	}
	return []any{ids, aggTypes, aggIDs, types, versions, payloads, headers, occurred}, nil
}
