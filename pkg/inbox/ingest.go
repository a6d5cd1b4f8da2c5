package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// insertBatch is the receiver's only write: one statement for the whole
// batch. ON CONFLICT DO NOTHING makes a redelivery (F4, F10) a no-op that
// still acks. Rows keep the batch's order (WITH ORDINALITY) so ids follow
// receipt order; the relay's "older" means lower id. Poison arrives with a
// park reason and is stored PARKED: kept, never retried by the relay.
const insertBatch = `
INSERT INTO inbox (source, event_id, event_type, schema_version, correlation_key, payload, payload_sha256,
                   attributes, message_id, delivery_attempt, traceparent, tracestate,
                   status, park_reason, last_error, parked_at)
SELECT m.source, m.event_id, m.event_type, m.schema_version, m.correlation_key, m.payload, m.sha,
       m.attrs::jsonb, m.message_id, m.delivery_attempt, m.traceparent, m.tracestate,
       CASE WHEN m.park_reason IS NULL THEN 'OPEN' ELSE 'PARKED' END,
       m.park_reason, m.park_error,
       CASE WHEN m.park_reason IS NULL THEN NULL ELSE now() END
FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::bytea[], $7::bytea[],
            $8::text[], $9::text[], $10::int[], $11::text[], $12::text[], $13::text[], $14::text[])
     WITH ORDINALITY AS m(source, event_id, event_type, schema_version, correlation_key, payload, sha,
                          attrs, message_id, delivery_attempt, traceparent, tracestate, park_reason, park_error, ord)
ORDER BY m.ord
ON CONFLICT (source, event_id) DO NOTHING
RETURNING source, event_id, status`

// recordConflicts runs only for the messages the insert skipped. It is a
// second statement (not a CTE of the first) on purpose: under READ COMMITTED
// it takes a fresh snapshot, so it sees a conflicting row committed by a
// concurrent receiver after the insert's snapshot was taken (ON CONFLICT
// waited for that transaction). A different hash under the same id is a
// producer bug (seed 004): the second payload is kept, never dropped.
const recordConflicts = `
INSERT INTO inbox_conflicts (source, event_id, payload, payload_sha256, attributes, message_id)
SELECT m.source, m.event_id, m.payload, m.sha, m.attrs::jsonb, m.message_id
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::text[], $6::text[])
     AS m(source, event_id, payload, sha, attrs, message_id)
JOIN inbox i ON i.source = m.source AND i.event_id = m.event_id
WHERE i.payload_sha256 <> m.sha
ON CONFLICT (source, event_id, payload_sha256) DO NOTHING
RETURNING source, event_id`

// IngestResult counts what one Ingest call stored.
type IngestResult struct {
	// Inserted new OPEN entries.
	Inserted int
	// Poison stored as PARKED entries.
	Poison int
	// Duplicates: already stored with the same payload (a redelivery).
	Duplicates int
	// Conflicts: newly recorded in inbox_conflicts (stored under the same id
	// with a DIFFERENT payload). A redelivered conflicting message is already
	// recorded and counts as a duplicate.
	Conflicts int
}

// Store writes received messages to the inbox table.
type Store struct {
	pool     *pgxpool.Pool
	received metric.Int64Counter
	// maxDeadlockRetries bounds the retries of a batch chosen as a deadlock
	// victim (two receivers inserting overlapping keys in opposite orders).
	maxDeadlockRetries int
}

// NewStore returns a Store on pool. meter may be nil (no metrics).
func NewStore(pool *pgxpool.Pool, meter metric.Meter) (*Store, error) {
	if pool == nil {
		return nil, errors.New("inbox: nil pool")
	}
	if meter == nil {
		meter = noop.NewMeterProvider().Meter("")
	}
	received, err := meter.Int64Counter("inbox.received",
		metric.WithDescription("Messages stored by the inbox receiver, by outcome (inserted, poison, duplicate, conflict). conflict is a producer bug: alert."))
	if err != nil {
		return nil, err
	}
	// Duplicates absorbed and payload conflicts are read by the dashboard and
	// alerts; their series exist at 0 from the start.
	for _, outcome := range []string{"inserted", "poison", "duplicate", "conflict"} {
		received.Add(context.Background(), 0, metric.WithAttributes(attribute.String("outcome", outcome)))
	}
	return &Store{pool: pool, received: received, maxDeadlockRetries: 3}, nil
}

// Ingest stores msgs in one transaction. A nil error means every message is
// durably stored (new, duplicate, conflict or poison) and may be acked; an
// error means none may be acked (nack: the broker redelivers).
//
// Rows keep the batch order rather than a sorted key order, so two
// concurrent batches with overlapping keys in opposite orders can deadlock;
// PostgreSQL aborts one, and Ingest retries it (bounded). Such overlaps are
// only concurrent duplicate deliveries, which are rare.
func (s *Store) Ingest(ctx context.Context, msgs []Message) (IngestResult, error) {
	if len(msgs) == 0 {
		return IngestResult{}, nil
	}
	cols, err := toColumns(msgs)
	if err != nil {
		return IngestResult{}, err
	}
	for attempt := 0; ; attempt++ {
		res, err := s.ingestOnce(ctx, cols)
		var pgErr *pgconn.PgError
		if err != nil && errors.As(err, &pgErr) && pgErr.Code == "40P01" && attempt < s.maxDeadlockRetries {
			continue
		}
		if err == nil {
			for outcome, n := range map[string]int{"inserted": res.Inserted, "poison": res.Poison, "duplicate": res.Duplicates, "conflict": res.Conflicts} {
				if n > 0 {
					s.received.Add(ctx, int64(n), metric.WithAttributes(attribute.String("outcome", outcome)))
				}
			}
		}
		return res, err
	}
}

func (s *Store) ingestOnce(ctx context.Context, c columns) (IngestResult, error) {
	var res IngestResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		res = IngestResult{}
		rows, err := tx.Query(ctx, insertBatch, c.source, c.eventID, c.eventType, c.schemaVersion,
			c.correlationKey, c.payload, c.sha, c.attrs, c.messageID, c.deliveryAttempt,
			c.traceparent, c.tracestate, c.parkReason, c.parkError)
		if err != nil {
			return fmt.Errorf("inbox: insert batch: %w", err)
		}
		inserted := make(map[[2]string]bool, len(c.source))
		for rows.Next() {
			var src, id, status string
			if err := rows.Scan(&src, &id, &status); err != nil {
				rows.Close()
				return err
			}
			inserted[[2]string{src, id}] = true
			if Status(status) == StatusParked {
				res.Poison++
			} else {
				res.Inserted++
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("inbox: insert batch: %w", err)
		}
		// Messages not inserted: a redelivery, or a conflict. A message may
		// also repeat inside one batch; the first copy wins.
		var d columns
		seen := make(map[[2]string]bool, len(c.source))
		for i := range c.source {
			k := [2]string{c.source[i], c.eventID[i]}
			if inserted[k] && !seen[k] {
				seen[k] = true
				continue
			}
			d.source = append(d.source, c.source[i])
			d.eventID = append(d.eventID, c.eventID[i])
			d.payload = append(d.payload, c.payload[i])
			d.sha = append(d.sha, c.sha[i])
			d.attrs = append(d.attrs, c.attrs[i])
			d.messageID = append(d.messageID, c.messageID[i])
		}
		if len(d.source) == 0 {
			return nil
		}
		rows, err = tx.Query(ctx, recordConflicts, d.source, d.eventID, d.payload, d.sha, d.attrs, d.messageID)
		if err != nil {
			return fmt.Errorf("inbox: record conflicts: %w", err)
		}
		newConflicts := 0
		for rows.Next() {
			newConflicts++
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("inbox: record conflicts: %w", err)
		}
		res.Conflicts = newConflicts
		res.Duplicates = len(d.source) - newConflicts
		return nil
	})
	return res, err
}

// columns is a batch in column-major form for unnest().
type columns struct {
	source, eventID, eventType []string
	schemaVersion              []int32
	correlationKey             []*string
	payload, sha               [][]byte
	attrs, messageID           []string
	deliveryAttempt            []int32
	traceparent, tracestate    []string
	parkReason, parkError      []*string
}

func toColumns(msgs []Message) (columns, error) {
	var c columns
	for i := range msgs {
		m := &msgs[i]
		if m.Source == "" || m.EventID == "" {
			return columns{}, fmt.Errorf("inbox: message %d has no source or event id (poison must be keyed by its message id)", i)
		}
		attrs := m.Attributes
		if attrs == nil {
			attrs = map[string]string{}
		}
		a, err := json.Marshal(attrs)
		if err != nil {
			return columns{}, err
		}
		sum := sha256.Sum256(m.Payload)
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		c.source = append(c.source, m.Source)
		c.eventID = append(c.eventID, m.EventID)
		c.eventType = append(c.eventType, m.EventType)
		c.schemaVersion = append(c.schemaVersion, int32(m.SchemaVersion))
		c.correlationKey = append(c.correlationKey, nullable(m.CorrelationKey))
		c.payload = append(c.payload, payload)
		c.sha = append(c.sha, sum[:])
		c.attrs = append(c.attrs, string(a))
		c.messageID = append(c.messageID, m.MessageID)
		c.deliveryAttempt = append(c.deliveryAttempt, int32(m.DeliveryAttempt))
		c.traceparent = append(c.traceparent, m.Traceparent)
		c.tracestate = append(c.tracestate, m.Tracestate)
		var reason, perr *string
		if m.ParkReason != "" {
			reason, perr = &m.ParkReason, &m.ParkError
		}
		c.parkReason = append(c.parkReason, reason)
		c.parkError = append(c.parkError, perr)
	}
	return c, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
