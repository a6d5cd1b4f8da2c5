// Package dedup makes a message consumer idempotent: an event's effect is
// applied at most once per consumer, however often the broker delivers it
// (at-least-once delivery, redelivery after a lost ack, two replicas
// receiving the same message at once).
//
// # Guarantee
//
// Before applying an event, the consumer calls Claim in the transaction
// that applies the effect. Claim inserts a marker (consumer, event id) into
// processed_events; the primary key arbitrates. The first delivery inserts
// and applies (New); any later or concurrent delivery finds the key taken
// and applies nothing (Duplicate). Insert-first, never check-then-act: a
// "does it exist?" query followed by an insert lets two deliveries both see
// "no" and both apply. The marker and the effect commit together, and the
// message is acked only after that commit: a crash before commit leaves no
// marker (the redelivery applies), a lost ack after commit finds the marker
// (the redelivery is a no-op). The same id with another payload (SHA-256
// compared) is a producer bug, reported as Conflict, never silently taken
// for a duplicate.
//
// The guarantee holds while the marker exists: markers are deleted by the
// Cleaner after a retention that must exceed the longest time the broker
// may still deliver an event (Config.Retention).
//
// # Schema
//
// One table, {schema}.processed_events, shipped as an embedded goose
// migration: apply Migrations(schema) with pkg/pgmigrate (or call Migrate)
// before the service's own migrations. The schema defaults to
// DefaultSchema; a service that keeps the table elsewhere passes the same
// name to Migrations and, through WithSchema, to Claim and NewCleaner.
//
// # Operations
//
// Run a Cleaner (one per database is enough; several are harmless). It logs
// each pass; a failing pass is retried at the next interval. There is no
// operator action: a marker is never replayed, and deleting one by hand
// re-enables its event. See docs/adr/0007 for where dedup sits next to the
// transactional inbox (pkg/inbox): the inbox stores before it applies,
// dedup applies directly in the consumer's transaction.
package dedup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// MaxEventIDLength is processed_events.event_id's CHECK limit
// (migrations/00001_dedup.sql), in characters: a consumer parks a message
// whose id is longer instead of failing its batch on the constraint.
const MaxEventIDLength = 200

// Outcome of claiming an event.
type Outcome int

const (
	// New: the marker was inserted; apply the effect in the same transaction.
	New Outcome = iota + 1
	// Duplicate: the event was already processed; apply nothing, commit, ack.
	Duplicate
	// Conflict: the id was processed with different content. A producer bug
	// apply nothing, ack, and alert; it is not a normal duplicate.
	Conflict
)

func (o Outcome) String() string {
	switch o {
	case New:
		return "new"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Event identifies one delivery's business event.
type Event struct {
	// Consumer scopes the marker: two consumers may each process one event.
	Consumer string
	// ID is the emitter's event id, stable across redelivery and re-publishing.
	ID string
	// Type is the event type, for inspection.
	Type string
	// Payload is the event's content; its SHA-256 detects a reused id.
	Payload []byte
}

// qClaim inserts the marker; ON CONFLICT DO NOTHING turns a duplicate into
// "no row returned" without aborting the caller's transaction. A concurrent
// delivery of the same id blocks here until the first transaction ends, then
// sees the conflict (first committed) or inserts (first rolled back).
const qClaim = `
INSERT INTO {schema}.processed_events (consumer, event_id, event_type, fingerprint)
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING true`

// qFingerprint reads the stored fingerprint of an already processed event.
// Only after the insert lost, so it is not a check-then-act.
const qFingerprint = `SELECT fingerprint FROM {schema}.processed_events WHERE consumer = $1 AND event_id = $2`

// DB is what Claim and the Cleaner need of a database handle: a pgx.Tx for
// Claim (the transaction that applies the effect), a *pgxpool.Pool or a
// *pgx.Conn for the Cleaner.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Option is optional behaviour of Claim and NewCleaner.
type Option func(*options)

type options struct{ schema string }

// WithSchema names the PostgreSQL schema holding processed_events, the one
// Migrations was applied to. Default DefaultSchema.
func WithSchema(name string) Option {
	return func(o *options) { o.schema = name }
}

func schemaOf(opts []Option) (string, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s := pgmigrate.SchemaOrDefault(o.schema)
	if err := pgmigrate.ValidateSchema(s); err != nil {
		return "", fmt.Errorf("dedup: %w", err)
	}
	return s, nil
}

// Claim inserts ev's marker in tx, the transaction that applies the effect:
// apply it only when Claim returns New. Of the options it uses WithSchema;
// its statements are rendered per call, a few string operations against a
// database round trip.
func Claim(ctx context.Context, tx DB, ev Event, opts ...Option) (Outcome, error) {
	if ev.Consumer == "" || ev.ID == "" {
		return 0, errors.New("dedup: Consumer and ID are required")
	}
	schema, err := schemaOf(opts)
	if err != nil {
		return 0, err
	}
	sum := sha256.Sum256(ev.Payload)
	var inserted bool
	err = tx.QueryRow(ctx, pgmigrate.Render(qClaim, schema), ev.Consumer, ev.ID, ev.Type, sum[:]).Scan(&inserted)
	if err == nil {
		return New, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("dedup: claim %s/%s: %w", ev.Consumer, ev.ID, err)
	}
	var stored []byte
	if err := tx.QueryRow(ctx, pgmigrate.Render(qFingerprint, schema), ev.Consumer, ev.ID).Scan(&stored); err != nil {
		return 0, fmt.Errorf("dedup: read fingerprint %s/%s: %w", ev.Consumer, ev.ID, err)
	}
	if !bytes.Equal(stored, sum[:]) {
		return Conflict, nil
	}
	return Duplicate, nil
}
