// Package inbox is the receiving half of reliable messaging (ADR 0007,
// variant 2): a table that stores every incoming event idempotently BEFORE the
// broker is acked, and a relay that applies the stored entries later, one
// correlation key at a time, with business rejections parked instead of lost.
//
// The pieces, in the order a message meets them:
//
//   - Store.Ingest: ONE multi-row INSERT ... ON CONFLICT DO NOTHING per batch
//     (unique key: source + the emitter's business event id). The caller acks
//     only after it returns nil. Poison is inserted already PARKED, with its
//     raw bytes and reason. The same id with a different payload hash is a
//     producer bug: recorded in inbox_conflicts, counted, never dropped.
//   - Relay: claims due OPEN entries with FOR UPDATE SKIP LOCKED, never an
//     entry while an older unresolved entry of the same key exists, and runs
//     the Handler in the claiming transaction: a BatchHandler once for the
//     whole batch (falling back to one savepoint per entry when the batch
//     fails technically), a plain Handler per entry in a savepoint. The
//     handler's error decides:
//     nil = APPLIED; Duplicate = DUPLICATE; Park = PARKED now; Defer = back off
//     until a deadline, then PARKED; anything else is technical: back off with
//     jitter, forever, visible through the age-of-oldest-open-entry alarm.
//   - Ops: list, show, replay (reopen) parked entries with ticket + actor +
//     audit row, cleanup of resolved entries in bounded batches.
//   - Monitor: the inbox's two alarms (parked count, oldest open age) and
//     open conflicts, as metrics refreshed on an interval.
//
// The package is generic: it knows nothing about work orders. A service
// supplies the decoding (Message) and the effect (Handler).
package inbox

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
)

// Status is an inbox entry's state (CHECK constraint in the migration).
type Status string

const (
	// StatusOpen: stored, not yet resolved; due at next_attempt_at.
	StatusOpen Status = "OPEN"
	// StatusApplied: the handler's effect committed with this status.
	StatusApplied Status = "APPLIED"
	// StatusDuplicate: the handler recognised the effect as already applied.
	StatusDuplicate Status = "DUPLICATE"
	// StatusParked: a business rejection or poison; kept until a person acts.
	StatusParked Status = "PARKED"
)

// Park reasons set by this package; services add their own.
const (
	// ReasonPoison: the message could not be decoded or validated (F9).
	ReasonPoison = "POISON"
)

// Message is one received message, decoded by the service into what the
// inbox stores. A message the service could not decode still becomes a
// Message, with ParkReason set: it is stored PARKED, never dropped.
type Message struct {
	// Source names the emitter; with EventID the deduplication key.
	Source string
	// EventID is the emitter's business event id (stable across re-publishing).
	EventID string
	// EventType is the event's type name (proto full name); may be empty for poison.
	EventType string
	// SchemaVersion of the payload; 0 when unknown.
	SchemaVersion int
	// CorrelationKey serializes application (e.g. the work order id); empty for poison without one.
	CorrelationKey string
	// Payload is the raw message body, stored as received.
	Payload []byte
	// Attributes are the transport attributes, stored as received.
	Attributes map[string]string
	// MessageID is the transport's message id (not the dedup key).
	MessageID string
	// DeliveryAttempt is the transport's delivery counter (0 when unknown).
	DeliveryAttempt int
	// Traceparent and Tracestate continue the producer's trace (W3C).
	Traceparent string
	Tracestate  string
	// ParkReason, when set, stores the message PARKED with ParkError (poison).
	ParkReason string
	ParkError  string
}

// Entry is one stored inbox row.
type Entry struct {
	ID              int64
	Source          string
	EventID         string
	EventType       string
	SchemaVersion   int
	CorrelationKey  string
	Payload         []byte
	PayloadSHA256   []byte
	Attributes      map[string]string
	MessageID       string
	DeliveryAttempt int
	Traceparent     string
	Tracestate      string
	Status          Status
	ParkReason      string
	Attempts        int
	NextAttemptAt   time.Time
	LastError       string
	ReceivedAt      time.Time
	ProcessedAt     *time.Time
	ParkedAt        *time.Time
}

// Handler applies one entry inside the relay's transaction: its writes and
// the entry's status change commit together, or not at all. Returning an
// error rolls its writes back (a savepoint) and classifies the entry; see
// Classify.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, e *Entry) error
}

// BatchHandler is a Handler that can also apply a whole claimed batch at
// once, in a few set-based statements instead of several per entry. The relay
// prefers HandleBatch and keeps Handle for the fallback below.
type BatchHandler interface {
	Handler
	// HandleBatch applies es, in order, inside the relay's transaction and
	// returns one result per entry: nil when applied, or a Classified
	// rejection (Duplicate, Deferred, Parked) for which it wrote NOTHING:
	// there is no savepoint to undo partial writes. Every other failure,
	// e.g. a database error, is returned as err. The relay then rolls the
	// transaction back and applies the same batch again through Handle, each
	// entry in its own savepoint, so one failing entry gets its technical
	// backoff without holding back the others.
	HandleBatch(ctx context.Context, tx pgx.Tx, es []*Entry) ([]error, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, e *Entry) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, e *Entry) error { return f(ctx, tx, e) }

// entryColumns is the select list scanned by scanEntry.
const entryColumns = `id, source, event_id, event_type, schema_version, coalesce(correlation_key, ''),
	payload, payload_sha256, attributes, message_id, delivery_attempt, traceparent, tracestate,
	status, coalesce(park_reason, ''), attempts, next_attempt_at, coalesce(last_error, ''),
	received_at, processed_at, parked_at`

func scanEntry(row pgx.Row) (Entry, error) {
	var e Entry
	var attrs []byte
	var status string
	err := row.Scan(&e.ID, &e.Source, &e.EventID, &e.EventType, &e.SchemaVersion, &e.CorrelationKey,
		&e.Payload, &e.PayloadSHA256, &attrs, &e.MessageID, &e.DeliveryAttempt, &e.Traceparent, &e.Tracestate,
		&status, &e.ParkReason, &e.Attempts, &e.NextAttemptAt, &e.LastError,
		&e.ReceivedAt, &e.ProcessedAt, &e.ParkedAt)
	if err != nil {
		return Entry{}, err
	}
	e.Status = Status(status)
	if len(attrs) > 0 {
		if err := json.Unmarshal(attrs, &e.Attributes); err != nil {
			return Entry{}, err
		}
	}
	return e, nil
}
