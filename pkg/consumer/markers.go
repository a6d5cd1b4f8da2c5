package consumer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// MaxEventIDLength is processed_events.event_id's CHECK limit
// (migrations/00001_dedup.sql), in characters: a consumer parks a message
// whose id is longer instead of failing its batch on the constraint.
const MaxEventIDLength = 200

// Outcome of claiming an event.
type Outcome int

const (
	// Claimed: the marker was inserted; apply the effect in the same
	// transaction.
	Claimed Outcome = iota + 1
	// Duplicate: the event was already processed; apply nothing, commit, ack.
	Duplicate
	// Conflict: the id was processed with different content. A producer bug:
	// apply nothing, park, and alert; it is not a normal duplicate.
	Conflict
)

func (o Outcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Marker identifies one delivery's business event.
type Marker struct {
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

// Option is wiring of New, NewMarkers and NewCleaner that must match the
// migrations, not a tunable, hence an Option rather than a Config field.
type Option func(*options)

type options struct {
	schema string
	parked *parked.Store
}

// WithSchema names the PostgreSQL schema holding processed_events, the one
// Migrations was applied to. Default DefaultSchema.
func WithSchema(name string) Option { return func(o *options) { o.schema = name } }

// WithParked sets where New's consumer parks messages and replays them
// from. Default: a parked.Store in the schema of WithSchema.
func WithParked(s *parked.Store) Option { return func(o *options) { o.parked = s } }

func optionsOf(opts []Option) (options, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	o.schema = pgmigrate.SchemaOrDefault(o.schema)
	if err := pgmigrate.ValidateSchema(o.schema); err != nil {
		return options{}, fmt.Errorf("consumer: %w", err)
	}
	return o, nil
}

// Markers claims events in processed_events, its statements rendered once
// for its schema.
type Markers struct {
	qClaim, qFingerprint string
}

// NewMarkers returns the claim primitive New's consumer uses, for a
// consumer that owns its loop. Of the options it uses WithSchema.
func NewMarkers(opts ...Option) (*Markers, error) {
	o, err := optionsOf(opts)
	if err != nil {
		return nil, err
	}
	return &Markers{qClaim: pgmigrate.Render(qClaim, o.schema), qFingerprint: pgmigrate.Render(qFingerprint, o.schema)}, nil
}

// Claim inserts mk's marker in tx, the transaction that applies the effect:
// apply it only when Claim returns Claimed.
func (s *Markers) Claim(ctx context.Context, tx pgdb.Executor, mk Marker) (Outcome, error) {
	b := &pgx.Batch{}
	cl, err := s.queueClaim(b, mk)
	if err != nil {
		return 0, err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, err
	}
	return cl.outcome(ctx, tx)
}

// claim is a marker's claim queued on a batch; its outcome is known once
// the batch was sent.
type claim struct {
	s        *Markers
	mk       Marker
	sum      [sha256.Size]byte
	inserted bool
}

// queueClaim queues mk's claim onto b, for the consumer to send with the
// statements before it (its savepoint) in one round trip.
func (s *Markers) queueClaim(b *pgx.Batch, mk Marker) (*claim, error) {
	if mk.Consumer == "" || mk.ID == "" {
		return nil, errors.New("consumer: Marker.Consumer and Marker.ID are required")
	}
	cl := &claim{s: s, mk: mk, sum: sha256.Sum256(mk.Payload)}
	b.Queue(s.qClaim, mk.Consumer, mk.ID, mk.Type, cl.sum[:]).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&cl.inserted)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("consumer: claim %s/%s: %w", mk.Consumer, mk.ID, err)
		}
		return nil
	})
	return cl, nil
}

// outcome of the sent claim: Claimed, or, when the insert lost, what the
// stored fingerprint says (one more round trip, for a redelivery only).
func (cl *claim) outcome(ctx context.Context, tx pgdb.Executor) (Outcome, error) {
	if cl.inserted {
		return Claimed, nil
	}
	var stored []byte
	if err := tx.QueryRow(ctx, cl.s.qFingerprint, cl.mk.Consumer, cl.mk.ID).Scan(&stored); err != nil {
		return 0, fmt.Errorf("consumer: read fingerprint %s/%s: %w", cl.mk.Consumer, cl.mk.ID, err)
	}
	if !bytes.Equal(stored, cl.sum[:]) {
		return Conflict, nil
	}
	return Duplicate, nil
}
