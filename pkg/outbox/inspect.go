package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgschema"
)

// State is an event's delivery state as the Inspector reports it: the status
// column of outbox, or PUBLISHED for a row of outbox_published. A PENDING
// event with a LeaseOwner is being dispatched in slow mode.
type State string

// The states of an event (migrations/00001_outbox.sql).
const (
	StatePending   State = "PENDING"
	StateFailed    State = "FAILED"
	StatePublished State = "PUBLISHED"
)

// Limits of ListFilter.Limit.
const (
	// DefaultListLimit is the page size when none is asked for.
	DefaultListLimit = 50
	// MaxListLimit bounds one page: a read must not pull a whole backlog.
	MaxListLimit = 500
)

// Record is one event as stored, with its delivery state. The payload and
// headers are left out: a listing is for finding events, not reading them.
type Record struct {
	EventID       uuid.UUID
	Seq           int64 // the id column: claim order, and the order of List
	AggregateType string
	AggregateID   string
	Type          string
	SchemaVersion int
	State         State
	Attempts      int
	LastError     string
	NextAttemptAt *time.Time // backoff of a PENDING event after a failure
	LeaseOwner    string     // the relay dispatching it in slow mode, if any
	LeaseUntil    *time.Time
	OccurredAt    time.Time
	CreatedAt     time.Time
	PublishedAt   *time.Time // PUBLISHED only
}

// ListFilter selects events for Inspector.List. Empty fields match all.
type ListFilter struct {
	// States to list; empty means PENDING and FAILED (the undelivered).
	States []State
	// AggregateID restricts the list to one aggregate's events.
	AggregateID string
	// Type restricts the list to one event type.
	Type string
	// AfterSeq pages: only events with a larger Seq.
	AfterSeq int64
	// Limit caps the result; 0 means DefaultListLimit, at most MaxListLimit.
	Limit int
}

// ErrInvalidFilter is returned by List for a filter it cannot run.
var ErrInvalidFilter = errors.New("outbox: invalid list filter")

// Inspector reads the outbox for operators: what is pending, failed or
// published, and why. It never changes a row.
type Inspector struct {
	db   pgdb.Executor
	list string
}

// NewInspector returns an Inspector over db for the outbox in the schema of
// WithSchema (default DefaultSchema); it ignores the relay's other options.
func NewInspector(db pgdb.Executor, opts ...Option) (*Inspector, error) {
	if db == nil {
		return nil, errors.New("outbox: NewInspector needs a database handle")
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	return &Inspector{db: db, list: pgschema.Render(qInspectList, o.schema)}, nil
}

// inspectColumns are Record's columns, in the order scanned.
const inspectColumns = `event_id, id, aggregate_type, aggregate_id, event_type, schema_version`

// qInspectList lists events of both tables in id order. Each branch is
// limited on its own before the merge, so a page reads at most 2 x $5 rows;
// the state tests on $1 are constant for the statement, so a branch whose
// states are not asked for is not scanned at all. An empty optional filter
// ($2, $3) matches every row. The backlog (outbox) is small and its id and
// aggregate indexes serve the order. outbox_published has no index but its
// key and published_at (its insert is on the relay's hot path), so a
// PUBLISHED listing scans the retention window: ask for it by aggregate.
const qInspectList = `
(SELECT ` + inspectColumns + `, status, attempts, coalesce(last_error, ''), next_attempt_at,
        coalesce(lease_owner, ''), lease_until, occurred_at, created_at, NULL::timestamptz
 FROM {schema}.outbox
 WHERE status = ANY($1::text[]) AND ($2 = '' OR aggregate_id = $2) AND ($3 = '' OR event_type = $3) AND id > $4
 ORDER BY id
 LIMIT $5)
UNION ALL
(SELECT ` + inspectColumns + `, 'PUBLISHED', attempts, coalesce(last_error, ''), NULL::timestamptz,
        '', NULL::timestamptz, occurred_at, created_at, published_at
 FROM {schema}.outbox_published
 WHERE 'PUBLISHED' = ANY($1::text[]) AND ($2 = '' OR aggregate_id = $2) AND ($3 = '' OR event_type = $3) AND id > $4
 ORDER BY id
 LIMIT $5)
ORDER BY id
LIMIT $5`

// List returns the events matching f, in Seq (claim) order, and whether more
// follow the page. An event moves from outbox to outbox_published keeping its
// Seq, so paging by AfterSeq neither skips nor repeats it.
func (i *Inspector) List(ctx context.Context, f ListFilter) (records []Record, more bool, err error) {
	states := f.States
	if len(states) == 0 {
		states = []State{StatePending, StateFailed}
	}
	names := make([]string, 0, len(states))
	for _, s := range states {
		if !slices.Contains([]State{StatePending, StateFailed, StatePublished}, s) {
			return nil, false, fmt.Errorf("%w: unknown state %q", ErrInvalidFilter, s)
		}
		names = append(names, string(s))
	}
	switch {
	case f.Limit < 0 || f.Limit > MaxListLimit:
		return nil, false, fmt.Errorf("%w: limit %d not within 0..%d", ErrInvalidFilter, f.Limit, MaxListLimit)
	case f.Limit == 0:
		f.Limit = DefaultListLimit
	}
	// One more than asked for tells whether another page follows.
	rows, err := i.db.Query(ctx, i.list, names, f.AggregateID, f.Type, f.AfterSeq, f.Limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("outbox: list: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var r Record
		var state string
		if err := rows.Scan(&r.EventID, &r.Seq, &r.AggregateType, &r.AggregateID, &r.Type, &r.SchemaVersion,
			&state, &r.Attempts, &r.LastError, &r.NextAttemptAt, &r.LeaseOwner, &r.LeaseUntil,
			&r.OccurredAt, &r.CreatedAt, &r.PublishedAt); err != nil {
			return nil, false, fmt.Errorf("outbox: list: %w", err)
		}
		r.State = State(state)
		records = append(records, r)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("outbox: list: %w", err)
	}
	if len(records) > f.Limit {
		return records[:f.Limit], true, nil
	}
	return records, false, nil
}
