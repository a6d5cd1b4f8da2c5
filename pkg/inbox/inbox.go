// Package inbox is the receiving half of reliable messaging: a table that
// stores every incoming message idempotently BEFORE the broker is acked, and
// a relay that applies the stored entries later, one correlation key at a
// time, with business rejections parked instead of lost. Why an inbox and not
// nack + retry policy + dead-letter topic: docs/adr/0007; how errors are
// classified and retried: docs/adr/0008.
//
// Lesson: a consumer that stores a message durably before it acks, and applies
// it later from its own table, can lose nothing, apply nothing twice, keep
// one key's messages in order and wait for a condition (a hand-off not yet
// recorded) without holding the broker. Guards F4 and F10 (a copy or a
// redelivery stores nothing new), F5 and F8 (Defer, MakeDue: deferred, then
// parked at the deadline), F9 and H1 (poison and unstorable bytes parked
// alone, batch-mates stored), F11 (two event types of one key keep their
// order), F15 (an outage fails Ingest: nack, redelivered) and H9 (a panicking
// handler parks its entry); and the invariants I2 (nothing lost on receipt),
// I4 (per-key order), I5 (business rejections parked, technical failures
// retried), I6 (audited replay through the same relay) and I7 (the
// oldest-open-age and parked-count gauges).
//
// Next hop: pkg/outboxpubsub; the handler that applies a completion appends
// the order's next event to pkg/outbox in the relay's transaction, and that
// dispatcher publishes it.
//
// The package is generic: it knows nothing of the service's events. A
// service supplies the decoding (into a Message) and the effect (a Handler).
//
// # Guarantees
//
//   - Nothing acked is lost: Store.Ingest returns nil only once every message
//     of the batch is committed (new, duplicate, conflict or parked); ack
//     after it, nack on its error.
//   - Redelivery is a no-op: (Source, EventID) is unique, so a copy of a
//     stored message adds nothing. The same id with a different payload is a
//     producer bug, kept in inbox_conflicts and counted, never dropped.
//   - Poison is kept: a message the service could not decode is stored PARKED
//     with its raw bytes and reason (Message.ParkReason); so is a message
//     PostgreSQL cannot store as received (escaped, reason says why).
//   - Effect and status commit together: the Handler runs in the relay's
//     transaction; its writes and the entry's new status commit or roll back
//     as one. A crash re-applies the entry; it never half-applies it.
//   - Per-key order: an entry is never applied while an older (lower id)
//     entry of the same CorrelationKey is unresolved. Different keys proceed
//     in parallel, across any number of relay replicas.
//   - Every failure ends somewhere visible: a technical error (any error the
//     handler does not classify) is retried with backoff forever, seen by the
//     oldest-open-age alarm; a business rejection is parked at once (Park, or
//     an error marked with retry.Permanent) or after a deadline (Defer); a
//     recognised duplicate is resolved (AlreadyApplied); a panicking handler
//     parks the entry after Config.MaxAttempts.
//
// # Tables and schema
//
// {schema}.inbox (the entries), {schema}.inbox_conflicts (same id, other
// payload) and {schema}.inbox_audit (operator actions). Store.Ingest wakes
// idle relays with a NOTIFY on NotifyChannel(schema) after its commit, not
// inside it (package pgnotify says why); rows inserted by other means wake
// nobody and are found by polling. They ship as embedded goose migrations: apply Migrations(schema) with pkg/pgmigrate
// (or call Migrate) before the service's own migrations. The schema defaults
// to DefaultSchema ("public"); to keep the tables elsewhere, or to run two
// inboxes in one database, pass the same name to Migrations and, through
// WithSchema, to every constructor. No inbox table references
// a service table.
//
// # Pieces
//
//   - Store.Ingest: one multi-row INSERT ... ON CONFLICT DO NOTHING per batch,
//     in one round trip with its BEGIN, COMMIT and the relays' wake-up
//     (docs/adr/0023).
//   - Relay: claims due OPEN entries (FOR UPDATE SKIP LOCKED, with the per-key
//     guard; the claim travels with the BEGIN, the resolve with the COMMIT:
//     docs/adr/0023) and runs the Handler in the claiming transaction: a BatchHandler
//     once for the whole batch (falling back to one savepoint per entry when
//     the batch fails technically), a plain Handler per entry in a savepoint.
//     Its outcome: nil = APPLIED; AlreadyApplied = DUPLICATE; Park or
//     retry.Permanent = PARKED now; Defer = back off until Config.MaxAttempts
//     AND Config.MaxAge are reached, then PARKED; anything else = back off
//     with jitter and retry. Run any number of replicas.
//   - Store.MakeDue: in the caller's transaction, makes the deferred entries of a
//     key due at once, for when the condition they wait for becomes true.
//   - Ops: the operator actions (below).
//   - Monitor: the alarm gauges (below).
//
// # Configuration
//
// Config tunes the relay (batch size, poll and sweep intervals, deferral
// deadline, backoffs, timeouts); every field documents its default, and
// the services read them from the environment. MonitorConfig tunes the
// Monitor. Options (WithSchema, WithTracerProvider, WithAudit) are accepted by
// every constructor, each using those that apply. Store and Ops take a
// pgdb.DB, Monitor a pgdb.Executor (a pool, a connection or a transaction);
// the Relay takes a pool, because it holds a connection of its own for LISTEN.
//
// # Metrics
//
// Store: inbox.received{outcome=inserted|poison|duplicate|conflict}
// (conflict is a producer bug: alert). Relay: inbox.relay.outcomes{outcome,
// reason}, inbox.correlation.latency (receipt to applied),
// inbox.relay.claim_failures, inbox.relay.batch_fallbacks,
// inbox.relay.handler_panics. Monitor, refreshed on an interval by bounded
// queries: inbox.oldest_open_age (alarm: stalled relay or an entry retrying
// forever), inbox.parked_entries{reason} (alarm: needs a person),
// inbox.open_conflicts (alarm: producer bug), inbox.open_entries.
//
// # Operator operations
//
// Ops.List and Ops.Get show entries (parked ones by reason). Ops.Replay
// reopens PARKED entries, by ids or by a bounded received_at range, after the
// cause was fixed: they go through the same relay and handler as new entries,
// and a second identical replay changes nothing. Ops.Cleanup deletes resolved
// entries past a retention (default DefaultRetention, never PARKED or OPEN
// ones) in short batches; CleanupResolved is its unattended form. Every
// mutating action needs a ticket and an actor (Authorization) and is audited
// in its own transaction: a row in {schema}.inbox_audit, or, with WithAudit,
// in the service's own audit log, so that a service keeps one log for all its
// privileged actions. A PARKED entry can also be repaired with one line of
// SQL (UPDATE {schema}.inbox SET status = 'OPEN', attempts = 0,
// next_attempt_at = now() WHERE id = ...), which is all Replay does.
package inbox

import (
	"context"
	"encoding/json"
	"fmt"
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
	// rejection (Duplicate, Deferred, Parked) or an error marked with
	// retry.Permanent, for which it wrote NOTHING:
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

// scanEntries reads claimDue's rows.
func scanEntries(rows pgx.Rows) ([]Entry, error) {
	var out []Entry
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: claim: %w", err)
	}
	return out, nil
}
