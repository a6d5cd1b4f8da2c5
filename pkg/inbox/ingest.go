package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgnotify"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// insertBatch is the receiver's write: one statement for the whole batch.
// ON CONFLICT DO NOTHING makes a redelivery (F4, F10) a no-op that still
// acks. Poison arrives with a park reason and is stored PARKED: kept, never
// retried by the relay.
//
// Two orders meet here. The arrays arrive sorted by (source, event_id) and
// rows are inserted in that order (pos): every inserter takes the unique
// index's locks in one canonical order, so concurrent batches with
// overlapping keys wait for each other but cannot deadlock. Ids, however,
// are drawn from the identity's sequence in receipt order (the subquery is
// sorted by receipt, and PostgreSQL evaluates a volatile select-list function
// after its subquery's sort), because the relay's "older" is "lower id"
// (I4). A skipped duplicate burns its id, as the identity default did.
const insertBatch = `
INSERT INTO {schema}.inbox (id, source, event_id, event_type, schema_version, correlation_key, payload, payload_sha256,
                   attributes, message_id, delivery_attempt, traceparent, tracestate,
                   status, park_reason, last_error, parked_at)
OVERRIDING SYSTEM VALUE
SELECT r.id, r.source, r.event_id, r.event_type, r.schema_version, r.correlation_key, r.payload, r.sha,
       r.attrs::jsonb, r.message_id, r.delivery_attempt, r.traceparent, r.tracestate,
       CASE WHEN r.park_reason IS NULL THEN 'OPEN' ELSE 'PARKED' END,
       r.park_reason, r.park_error,
       CASE WHEN r.park_reason IS NULL THEN NULL ELSE now() END
FROM (SELECT nextval(pg_get_serial_sequence('{schema}.inbox', 'id')) AS id, m.*
      FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::bytea[], $7::bytea[],
                  $8::text[], $9::text[], $10::int[], $11::text[], $12::text[], $13::text[], $14::text[], $15::int[])
           WITH ORDINALITY AS m(source, event_id, event_type, schema_version, correlation_key, payload, sha,
                                attrs, message_id, delivery_attempt, traceparent, tracestate, park_reason, park_error,
                                receipt, pos)
      ORDER BY m.receipt) r
ORDER BY r.pos
ON CONFLICT (source, event_id) DO NOTHING
RETURNING source, event_id, status`

// recordConflicts matters only for the messages the insert skipped (it
// receives the whole batch when pipelined with the insert: the stored rows
// match their own hash and drop out). It is a
// second statement (not a CTE of the first) on purpose: under READ COMMITTED
// it takes a fresh snapshot, so it sees a conflicting row committed by a
// concurrent receiver after the insert's snapshot was taken (ON CONFLICT
// waited for that transaction). A different hash under the same id is a
// producer bug: the second payload is kept, never dropped. Rows go in
// one canonical order, like the inbox insert, so that concurrent batches
// cannot deadlock on inbox_conflicts either.
const recordConflicts = `
INSERT INTO {schema}.inbox_conflicts (source, event_id, payload, payload_sha256, attributes, message_id)
SELECT m.source, m.event_id, m.payload, m.sha, m.attrs::jsonb, m.message_id
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[], $5::text[], $6::text[])
     AS m(source, event_id, payload, sha, attrs, message_id)
JOIN {schema}.inbox i ON i.source = m.source AND i.event_id = m.event_id
WHERE i.payload_sha256 <> m.sha
ORDER BY m.source, m.event_id, m.sha
ON CONFLICT (source, event_id, payload_sha256) DO NOTHING
RETURNING source, event_id`

// Column limits of the inbox table (CHECK constraints in
// migrations/00001_inbox.sql), in characters.
const (
	MaxSourceLength  = 64
	MaxEventIDLength = 200
)

// IngestResult counts what one Ingest call stored.
type IngestResult struct {
	// Inserted new OPEN entries.
	Inserted int
	// Poison stored as PARKED entries (Rejected included).
	Poison int
	// Rejected counts the Poison entries parked by the store itself because
	// their data could not be stored as received (see Store.Ingest).
	Rejected int
	// Duplicates: already stored with the same payload (a redelivery).
	Duplicates int
	// Conflicts: newly recorded in inbox_conflicts (stored under the same id
	// with a DIFFERENT payload). A redelivered conflicting message is already
	// recorded and counts as a duplicate.
	Conflicts int
	// WakeErr: the entries are stored and committed, but the notification
	// that wakes the relays failed; they find the entries by polling. The
	// messages may be acked. Log it.
	WakeErr error
}

// Store writes received messages to the inbox table.
type Store struct {
	db       pgdb.DB
	q        queries
	received metric.Int64Counter
}

// NewStore returns a Store on db. meter may be nil (no metrics). Of the
// options it uses WithSchema.
func NewStore(db pgdb.DB, meter metric.Meter, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("inbox: NewStore needs a database handle")
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	meter = telemetry.MeterOrNoop(meter)
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
	return &Store{db: db, q: newQueries(o.schema), received: received}, nil
}

// Ingest stores msgs in one transaction. A nil error means every message is
// durably stored (new, duplicate, conflict or parked) and may be acked; an
// error means none may be acked (nack: the broker redelivers).
//
// One message's data never fails its batch. A message carrying what
// PostgreSQL cannot store (a NUL byte or invalid UTF-8 in a text field or an
// attribute, an event id over MaxEventIDLength) is stored PARKED, escaped
// (pgtext.Storable, pgtext.StorableMap; under PoisonKey when its event id is
// the problem), with its raw payload. If the single-statement batch insert
// still fails with a data error (pgdb.IsData: a rule this code does not
// know), Ingest stores the batch again one message per savepoint and parks
// each message the database rejects. Any other error fails the batch.
//
// Rows are inserted in (source, event_id) order, so concurrent batches with
// overlapping keys cannot deadlock; ids still follow receipt order.
func (s *Store) Ingest(ctx context.Context, msgs []Message) (IngestResult, error) {
	if len(msgs) == 0 {
		return IngestResult{}, nil
	}
	rows, err := prepare(msgs)
	if err != nil {
		return IngestResult{}, err
	}
	res, err := s.ingestBatch(ctx, rows)
	if pgdb.IsData(err) {
		res, err = s.ingestIsolated(ctx, rows)
		// New OPEN entries wake the relays; parked poison wakes nobody.
		// After the commit when Ingest owns the transaction (pgnotify).
		if err == nil && res.Inserted > 0 {
			if err := pgnotify.Notify(ctx, s.db, pgnotify.Notification{Channel: s.q.channel}); err != nil {
				if _, inTx := s.db.(pgx.Tx); inTx {
					return IngestResult{}, err
				}
				res.WakeErr = err
			}
		}
	}
	if err != nil {
		return IngestResult{}, err
	}
	for outcome, n := range map[string]int{"inserted": res.Inserted, "poison": res.Poison, "duplicate": res.Duplicates, "conflict": res.Conflicts} {
		if n > 0 {
			s.received.Add(ctx, int64(n), metric.WithAttributes(attribute.String("outcome", outcome)))
		}
	}
	return res, nil
}

// ingestBatch is the normal case, in one round trip on a pool (a pgdb.Tx
// whose statements all ride with its COMMIT, ADR 0023): BEGIN, the batch's insert, the conflicts
// of the copies it skipped, COMMIT, and the relays' wake-up after the
// commit. recordConflicts is sent before the insert's result is read, so it
// gets every row: those the insert stored carry the stored payload's hash
// and drop out of its WHERE, the same rows as when it was sent only for
// the skipped ones. The wake-up goes out even when nothing new was stored
// (a redelivery, parked poison): a relay then claims nothing.
func (s *Store) ingestBatch(ctx context.Context, rows []row) (IngestResult, error) {
	var (
		res          IngestResult
		inserted     map[rowKey]bool
		newConflicts int
	)
	c := toColumns(rows)
	b := &pgx.Batch{}
	b.Queue(s.q.insertBatch, c.source, c.eventID, c.eventType, c.schemaVersion,
		c.correlationKey, c.payload, c.sha, c.attrs, c.messageID, c.deliveryAttempt,
		c.traceparent, c.tracestate, c.parkReason, c.parkError, c.receipt).Query(func(rs pgx.Rows) error {
		var err error
		inserted, err = scanInserted(rs, rows, &res)
		return err
	})
	b.Queue(s.q.recordConflicts, c.source, c.eventID, c.payload, c.sha, c.attrs, c.messageID).Query(func(rs pgx.Rows) error {
		for rs.Next() {
			newConflicts++
		}
		if err := rs.Err(); err != nil {
			return fmt.Errorf("inbox: record conflicts: %w", err)
		}
		return nil
	})
	tx, err := pgdb.Begin(ctx, s.db, nil)
	if err != nil {
		return IngestResult{}, err
	}
	tx.Notify(s.q.channel, "")
	if err := tx.CommitWith(ctx, b); err != nil {
		_ = tx.Rollback(ctx)
		return IngestResult{}, err
	}
	res.Conflicts = newConflicts
	res.Duplicates = len(skipped(rows, inserted)) - newConflicts
	res.WakeErr = tx.WakeErr()
	return res, nil
}

// ingestIsolated stores rows one savepoint each, in key order, after the
// batch statement failed with a data error. The messages the database
// rejects are parked afterwards, in the key order of their parked rows: every
// lock is still taken in one order per phase, so this path cannot deadlock
// with a concurrent batch either.
func (s *Store) ingestIsolated(ctx context.Context, rows []row) (IngestResult, error) {
	var res IngestResult
	err := pgdb.InTx(ctx, s.db, nil, func(tx *pgdb.Tx) error {
		res = IngestResult{}
		inserted := make(map[rowKey]bool, len(rows))
		stored := make([]row, 0, len(rows))
		var rejected []row
		for _, r := range rows {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			one, err := s.insertRows(ctx, sp, []row{r}, &res)
			if err != nil {
				if !pgdb.IsData(err) {
					return err
				}
				if rbErr := sp.Rollback(ctx); rbErr != nil {
					return rbErr
				}
				rejected = append(rejected, r.park("rejected by the database: "+err.Error()))
				continue
			}
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			for k := range one {
				inserted[k] = true
			}
			stored = append(stored, r)
		}
		if len(rejected) > 0 {
			sortRows(rejected)
			parked, err := s.insertRows(ctx, tx, rejected, &res)
			if err != nil {
				return fmt.Errorf("inbox: park rows the database rejected: %w", err)
			}
			for k := range parked {
				inserted[k] = true
			}
			stored = append(stored, rejected...)
			sortRows(stored)
		}
		return s.insertConflicts(ctx, tx, stored, inserted, &res)
	})
	return res, err
}

type rowKey struct{ source, eventID string }

// insertRows runs insertBatch for rs (in key order) and counts the rows it
// stored into res; it returns their keys.
func (s *Store) insertRows(ctx context.Context, q pgx.Tx, rs []row, res *IngestResult) (map[rowKey]bool, error) {
	c := toColumns(rs)
	rows, err := q.Query(ctx, s.q.insertBatch, c.source, c.eventID, c.eventType, c.schemaVersion,
		c.correlationKey, c.payload, c.sha, c.attrs, c.messageID, c.deliveryAttempt,
		c.traceparent, c.tracestate, c.parkReason, c.parkError, c.receipt)
	if err != nil {
		return nil, fmt.Errorf("inbox: insert batch: %w", err)
	}
	defer rows.Close()
	return scanInserted(rows, rs, res)
}

// scanInserted reads insertBatch's result for rs into res and returns the
// keys it stored.
func scanInserted(rows pgx.Rows, rs []row, res *IngestResult) (map[rowKey]bool, error) {
	rejected := make(map[rowKey]bool)
	for _, r := range rs {
		if r.rejected {
			rejected[r.key()] = true
		}
	}
	inserted := make(map[rowKey]bool, len(rs))
	for rows.Next() {
		var k rowKey
		var status string
		if err := rows.Scan(&k.source, &k.eventID, &status); err != nil {
			return nil, err
		}
		inserted[k] = true
		switch {
		case Status(status) != StatusParked:
			res.Inserted++
		case rejected[k]:
			res.Poison++
			res.Rejected++
		default:
			res.Poison++
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: insert batch: %w", err)
	}
	return inserted, nil
}

// skipped returns the rows of rs the insert did not store: a key stored
// before, or a later copy of a key in rs (the first copy, in receipt order,
// wins).
func skipped(rs []row, inserted map[rowKey]bool) []row {
	var d []row
	seen := make(map[rowKey]bool, len(rs))
	for _, r := range rs {
		k := r.key()
		if inserted[k] && !seen[k] {
			seen[k] = true
			continue
		}
		d = append(d, r)
	}
	return d
}

// insertConflicts records the rows not inserted whose payload differs from
// the stored one, and counts the rest as duplicates.
func (s *Store) insertConflicts(ctx context.Context, tx pgx.Tx, rs []row, inserted map[rowKey]bool, res *IngestResult) error {
	d := skipped(rs, inserted)
	if len(d) == 0 {
		return nil
	}
	c := toColumns(d)
	rows, err := tx.Query(ctx, s.q.recordConflicts, c.source, c.eventID, c.payload, c.sha, c.attrs, c.messageID)
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
	res.Conflicts += newConflicts
	res.Duplicates += len(d) - newConflicts
	return nil
}
