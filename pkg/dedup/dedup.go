// Package dedup is the idempotent-consumer marker: before applying
// an event, the consumer inserts the event's id into processed_events inside
// the transaction that applies the effect. The primary key arbitrates: the
// first delivery inserts and applies; any later or concurrent delivery finds
// the key taken and applies nothing. Insert-first, never check-then-act: a
// "does it exist?" query followed by an insert lets two deliveries both see
// "no" and both apply.
//
// The marker and the effect commit together, and the message is acked only
// after that commit: a crash before commit leaves no marker (redelivery
// applies), a lost ack after commit finds the marker (redelivery is a no-op).
//
// Markers are kept for a retention that must exceed the longest time the
// broker may redeliver (Cleaner). Schema: table processed_events, created by
// each service's migration (reference DDL: migrations/billing/00001_billing.sql).
package dedup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

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
INSERT INTO processed_events (consumer, event_id, event_type, fingerprint)
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING true`

// qFingerprint reads the stored fingerprint of an already processed event.
// Only after the insert lost, so it is not a check-then-act.
const qFingerprint = `SELECT fingerprint FROM processed_events WHERE consumer = $1 AND event_id = $2`

// Claim inserts ev's marker in tx, which must also apply the effect.
func Claim(ctx context.Context, tx pgx.Tx, ev Event) (Outcome, error) {
	if ev.Consumer == "" || ev.ID == "" {
		return 0, errors.New("dedup: Consumer and ID are required")
	}
	sum := sha256.Sum256(ev.Payload)
	var inserted bool
	err := tx.QueryRow(ctx, qClaim, ev.Consumer, ev.ID, ev.Type, sum[:]).Scan(&inserted)
	if err == nil {
		return New, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("dedup: claim %s/%s: %w", ev.Consumer, ev.ID, err)
	}
	var stored []byte
	if err := tx.QueryRow(ctx, qFingerprint, ev.Consumer, ev.ID).Scan(&stored); err != nil {
		return 0, fmt.Errorf("dedup: read fingerprint %s/%s: %w", ev.Consumer, ev.ID, err)
	}
	if !bytes.Equal(stored, sum[:]) {
		return Conflict, nil
	}
	return Duplicate, nil
}
