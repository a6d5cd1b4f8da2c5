// Package parked keeps the messages a consumer cannot process, so that
// nothing it receives is dropped silently and nothing is retried forever: the
// message is stored with its raw bytes and the reason, and then acked.
//
// A consumer decodes each message first, with its own rules, and parks what
// it refuses (Store.Park) in the transaction that handles its batch-mates, or
// on its own. What the database refuses anyway (a rule the decoder does not
// know, pgdb.IsData) or what the consumer refuses after reading its state
// (Refuse) is isolated to its message by Isolate: the message's effects roll
// back and it is parked with the rule it broke, while its batch-mates commit.
// Only infrastructure failures nack.
//
// A parked row must be storable whatever the message carries: Park turns
// text PostgreSQL refuses (invalid UTF-8, NUL bytes) into its escaped form
// (pkg/pgtext) or NULL, says which in the stored reason, and keeps the payload
// unchanged in a bytea column. A redelivered message is parked once, per
// subscription and message id.
//
// Operators read the open rows (List, CountByReason) and, once the cause is
// fixed, replay a row through the consumer's normal path (Replay), which
// records who replayed it under which ticket in the same transaction.
//
// Lesson: a consumer that cannot process a message must neither drop it nor
// retry it forever; it keeps it, raw and with its reason, where a person sees
// it. Guards H2 (the row stores whatever bytes the message carries; the
// offending message alone is isolated) and the storing of H3's and H5's
// refusals, for the invariants I2 (parked is one of the three fates of a
// received message), I5 (business rejections parked and counted by reason)
// and I6 (replay through the consumer's path, with ticket and actor).
//
// Next hop: pkg/consumer; a parked message rejoins the order's path only when
// Replay sends it back through its consumer.
//
// Schema: table parked_messages, created by Migrations in the PostgreSQL
// schema given to WithSchema (default public). This package parks plain consumers' messages; the
// transactional inbox (pkg/inbox) keeps its own poison entries in place.
package parked

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtext"
)

// Option configures a Store.
type Option func(*options)

type options struct{ schema string }

// WithSchema places the Store in the PostgreSQL schema its Migrations were
// applied to (default DefaultSchema). It is wiring that must match the
// migrations, not a tunable, hence an Option rather than a Config field.
func WithSchema(name string) Option { return func(o *options) { o.schema = name } }

// Store parks, lists and replays messages in the parked_messages table.
type Store struct {
	qPark, qList, qCount, qLock, qMarkReplayed string
}

// New returns a Store whose queries are rendered, once, for its schema.
func New(opts ...Option) (*Store, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	o.schema = pgmigrate.SchemaOrDefault(o.schema)
	if err := pgmigrate.ValidateSchema(o.schema); err != nil {
		return nil, fmt.Errorf("parked: WithSchema: %w", err)
	}
	r := func(q string) string { return pgmigrate.Render(q, o.schema) }
	return &Store{qPark: r(qPark), qList: r(qList), qCount: r(qCount), qLock: r(qLock), qMarkReplayed: r(qMarkReplayed)}, nil
}

// Message is a message to park.
type Message struct {
	// Subscription the message came from (required).
	Subscription string
	// MessageID is the broker's id of the message (required): with
	// Subscription, what makes a redelivery park once.
	MessageID string
	// EventID and EventType, when known: stored as NULL when empty or not
	// storable as text.
	EventID, EventType string
	// Subject is what the message is about in the consumer's terms (a work
	// order id), for operators; NULL when empty or not storable.
	Subject string
	// Attributes as received.
	Attributes map[string]string
	// Data is the payload as received.
	Data []byte
	// Reason the message is parked (required).
	Reason string
}

// Stored is what Park stored.
type Stored struct {
	// ID of the new row; 0 when the message was already parked (a
	// redelivery), in which case nothing was stored.
	ID int64
	// Reason as stored: the message's reason made storable, followed by
	// which values were stored escaped or as NULL.
	Reason string
}

// qPark keeps a message; ON CONFLICT DO NOTHING parks a redelivery once
// without aborting the caller's transaction (no row returned).
const qPark = `
INSERT INTO {schema}.parked_messages (subscription, message_id, event_id, event_type, subject, attributes, data, reason)
VALUES ($1, $2, nullif($3, ''), nullif($4, ''), nullif($5, ''), $6, $7, $8)
ON CONFLICT (subscription, message_id) DO NOTHING
RETURNING id`

// Park stores m through db: the caller's transaction, to commit with its
// batch-mates' effects, or a pool.
func (s *Store) Park(ctx context.Context, db pgdb.Executor, m Message) (Stored, error) {
	if m.Subscription == "" || m.MessageID == "" || m.Reason == "" {
		return Stored{}, errors.New("parked: Subscription, MessageID and Reason are required")
	}
	r, err := storable(m)
	if err != nil {
		return Stored{}, err
	}
	var id int64
	err = db.QueryRow(ctx, s.qPark, r.subscription, r.messageID, r.eventID, r.eventType, r.subject, r.attributes, r.data, r.reason).Scan(&id)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Stored{}, fmt.Errorf("parked: park message %s: %w", r.messageID, err)
	}
	return Stored{ID: id, Reason: r.reason}, nil
}

// row is a parked_messages row as Park stores it.
type row struct {
	subscription, messageID, eventID, eventType, subject, reason string
	attributes, data                                             []byte
}

// storable builds the row that keeps m. Text PostgreSQL cannot hold is stored
// escaped (subscription, message id, attributes: they identify the message
// and must stay distinct) or as NULL (event id, event type, subject: the
// attributes and the payload still carry them), the reason says which, and
// the payload goes to the bytea column as received.
func storable(m Message) (row, error) {
	attrs, attrProblems, err := pgtext.StorableJSON(m.Attributes)
	if err != nil {
		return row{}, fmt.Errorf("parked: attributes: %w", err)
	}
	r := row{subscription: pgtext.Storable(m.Subscription), messageID: pgtext.Storable(m.MessageID),
		eventID: m.EventID, eventType: m.EventType, subject: m.Subject,
		reason: pgtext.Storable(m.Reason), attributes: attrs, data: m.Data}
	var escaped, nulled []string
	if len(attrProblems) > 0 {
		escaped = append(escaped, "attributes")
	}
	if pgtext.Problem(m.MessageID) != "" {
		escaped = append(escaped, "message_id")
	}
	if pgtext.Problem(m.Subscription) != "" {
		escaped = append(escaped, "subscription")
	}
	for name, v := range map[string]*string{"event_id": &r.eventID, "event_type": &r.eventType, "subject": &r.subject} {
		if pgtext.Problem(*v) != "" {
			*v, nulled = "", append(nulled, name)
		}
	}
	if len(escaped) > 0 {
		r.reason += "; stored escaped: " + strings.Join(escaped, ", ")
	}
	if len(nulled) > 0 {
		slices.Sort(nulled)
		r.reason += "; stored as NULL: " + strings.Join(nulled, ", ")
	}
	if r.data == nil {
		r.data = []byte{}
	}
	return r, nil
}

// Parked is a parked_messages row.
type Parked struct {
	// ID of the row: what an operator names to replay it.
	ID int64
	// Message as stored (see Park): text escaped or emptied where the
	// original could not be stored, the reason with Park's notes.
	Message
	ParkedAt time.Time
}

// ListFilter selects a page of open parked messages, oldest first.
type ListFilter struct {
	// Subscription restricts the page to one subscription; "" lists all.
	Subscription string
	// Subject restricts the page to the messages about one entity (what the
	// consumer stored as Message.Subject, e.g. a work order id); "" lists all.
	Subject string
	// AfterID is the ID of the last row of the previous page; 0 starts at the
	// oldest.
	AfterID int64
	// Limit is the page size. Default 100, at most 1000.
	Limit int
}

// qList is keyset paging over the open rows, served by the partial index on
// id WHERE replayed_at IS NULL. The subject filter has no index of its own:
// open parked rows are few (each waits for an operator).
const qList = `
SELECT id, subscription, message_id, coalesce(event_id, ''), coalesce(event_type, ''), coalesce(subject, ''),
       attributes, data, reason, parked_at
FROM {schema}.parked_messages
WHERE replayed_at IS NULL AND id > $1 AND ($2 = '' OR subscription = $2) AND ($4 = '' OR subject = $4)
ORDER BY id
LIMIT $3`

// List returns a page of the messages parked and not replayed, oldest first;
// the next page starts after the last ID returned.
func (s *Store) List(ctx context.Context, db pgdb.Executor, f ListFilter) ([]Parked, error) {
	switch {
	case f.Limit == 0:
		f.Limit = 100
	case f.Limit < 0 || f.Limit > 1000:
		return nil, fmt.Errorf("parked: Limit %d: want 1..1000", f.Limit)
	}
	rows, err := db.Query(ctx, s.qList, f.AfterID, f.Subscription, f.Limit, f.Subject)
	if err != nil {
		return nil, fmt.Errorf("parked: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, fmt.Errorf("parked: list: %w", err)
	}
	return out, nil
}

func scanParked(r pgx.CollectableRow) (Parked, error) {
	var p Parked
	var attrs []byte
	if err := r.Scan(&p.ID, &p.Subscription, &p.MessageID, &p.EventID, &p.EventType, &p.Subject,
		&attrs, &p.Data, &p.Reason, &p.ParkedAt); err != nil {
		return Parked{}, err
	}
	if err := json.Unmarshal(attrs, &p.Attributes); err != nil {
		return Parked{}, fmt.Errorf("parked message %d: attributes: %w", p.ID, err)
	}
	return p, nil
}

const qCount = `
SELECT reason, count(*) FROM {schema}.parked_messages
WHERE replayed_at IS NULL AND ($1 = '' OR subscription = $1)
GROUP BY reason`

// CountByReason counts the open parked messages of subscription ("" for all)
// by stored reason, for a gauge or a report. A reason often names the value
// at fault (an id, a type), so the map has as many keys as distinct causes:
// label a metric with it only where that stays bounded.
func (s *Store) CountByReason(ctx context.Context, db pgdb.Executor, subscription string) (map[string]int64, error) {
	rows, err := db.Query(ctx, s.qCount, subscription)
	if err != nil {
		return nil, fmt.Errorf("parked: count: %w", err)
	}
	out := map[string]int64{}
	var reason string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&reason, &n}, func() error {
		out[reason] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("parked: count: %w", err)
	}
	return out, nil
}

var (
	// ErrAuditRequired is returned by Replay without a ticket or an actor.
	ErrAuditRequired = errors.New("parked: a ticket and an actor are required")
	// ErrNotOpen is returned by Replay for an id that is not parked, or
	// already replayed.
	ErrNotOpen = errors.New("parked: no open parked message with this id")
)

// maxAuditLength is the CHECK limit of replayed_by and ticket, in characters.
const maxAuditLength = 200

// qLock reads an open row and locks it: a concurrent Replay of the same row
// waits, then finds it replayed (ErrNotOpen) instead of applying it twice.
const qLock = `
SELECT id, subscription, message_id, coalesce(event_id, ''), coalesce(event_type, ''), coalesce(subject, ''),
       attributes, data, reason, parked_at
FROM {schema}.parked_messages
WHERE id = $1 AND replayed_at IS NULL
FOR UPDATE`

const qMarkReplayed = `
UPDATE {schema}.parked_messages SET replayed_at = now(), replayed_by = $2, ticket = $3 WHERE id = $1`

// Replay applies the open parked message id, after an operator fixed its
// cause: in one transaction (a savepoint when db is a transaction) it locks
// the row, calls apply with it, and marks it replayed by actor under ticket.
// When apply fails nothing changes, the row stays open, and its error is
// returned.
func (s *Store) Replay(ctx context.Context, db pgdb.Beginner, id int64, ticket, actor string,
	apply func(ctx context.Context, tx pgx.Tx, p Parked) error) error {
	ticket, actor = strings.TrimSpace(ticket), strings.TrimSpace(actor)
	if ticket == "" || actor == "" {
		return ErrAuditRequired
	}
	for name, v := range map[string]string{"ticket": ticket, "actor": actor} {
		if p := pgtext.Problem(v); p != "" {
			return fmt.Errorf("parked: %s %s", name, p)
		}
		if n := utf8.RuneCountInString(v); n > maxAuditLength {
			return fmt.Errorf("parked: %s: %d characters, limit %d", name, n, maxAuditLength)
		}
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.qLock, id)
		if err != nil {
			return fmt.Errorf("parked: replay %d: %w", id, err)
		}
		p, err := pgx.CollectExactlyOneRow(rows, scanParked)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%w: %d", ErrNotOpen, id)
		case err != nil:
			return fmt.Errorf("parked: replay %d: %w", id, err)
		}
		if err := apply(ctx, tx, p); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.qMarkReplayed, id, actor, ticket); err != nil {
			return fmt.Errorf("parked: mark %d replayed: %w", id, err)
		}
		return nil
	})
}

// refusal is Refuse's error.
type refusal struct{ reason string }

func (r refusal) Error() string { return "parked: refused: " + r.reason }

// Refuse is the error fn returns to Isolate when the message cannot be
// applied (the state it finds rules it out, not the database): its effects
// roll back and the message is parked with reason.
func Refuse(reason string) error { return refusal{reason: reason} }

// Isolate runs fn in a transaction of db: a savepoint when db is the caller's
// transaction (a batch), a transaction of its own on a pool. When fn fails
// because of its message, its effects roll back, and Isolate returns the
// reason to park the message with and a nil error; db is then usable to park
// it in. fn fails because of its message when it returns Refuse(reason), or
// when the database refused a value (pgdb.IsData): the reason then names the
// rule and the SQLSTATE. Any other error is returned as it is: an
// infrastructure failure, for the caller to roll back and nack.
func Isolate(ctx context.Context, db pgdb.Beginner, fn func(tx pgx.Tx) error) (reason string, err error) {
	err = pgx.BeginFunc(ctx, db, fn)
	if err == nil {
		return "", nil
	}
	if reason, ok := Reason(err); ok {
		return reason, nil
	}
	return "", err
}

// Reason is Isolate's classification of fn's error, for a consumer that
// manages its savepoints itself (pkg/consumer pipelines them): ok when err
// is the message's fault (Refuse, or pgdb.IsData), with the reason to park
// it with; false for anything else, an infrastructure failure.
func Reason(err error) (reason string, ok bool) {
	var r refusal
	switch {
	case errors.As(err, &r):
		return r.reason, true
	case pgdb.IsData(err):
		return rejected(err), true
	}
	return "", false
}

// rejected is the park reason of a data error: the database's message names
// the rule (constraint, encoding); the SQLSTATE classifies it.
func rejected(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Sprintf("rejected by the database: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	return "rejected by the database: " + err.Error()
}
