package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgschema"
)

// MaxRequeueEvents bounds the events of one Requeue call: a page of the
// Inspector's listing (MaxListLimit). A requeue is a reviewed list of ids,
// not a sweep, and one call is one statement holding the row locks of every
// event it requeues.
const MaxRequeueEvents = MaxListLimit

// ErrInvalidRequeue is returned by Requeue for a request it refuses; nothing
// was changed.
var ErrInvalidRequeue = errors.New("outbox: invalid requeue request")

// RequeueRequest names FAILED events to requeue.
type RequeueRequest struct {
	// EventIDs to requeue, 1..MaxRequeueEvents (duplicates count once).
	// Only FAILED events are requeued; the others are reported, untouched.
	EventIDs []uuid.UUID
	// Note is who requeues under which change or incident ticket, e.g.
	// "requeued by jdoe, ticket OPS-123" (required). It is prepended to the
	// event's last_error ("<note>; was: <error>"), so the row itself carries
	// the audit trail after the relay has retried it.
	Note string
	// DryRun reports what would be requeued and changes nothing.
	DryRun bool
}

// RequeuedEvent is an event Requeue moved (or, on a dry run, would move)
// from FAILED to PENDING.
type RequeuedEvent struct {
	EventID     uuid.UUID
	Seq         int64
	AggregateID string
	Type        string
	// LastError is the error the event had failed with.
	LastError string
}

// SkippedEvent is an id Requeue left alone, with the state it found:
// PENDING, PUBLISHED (within the retention), or "" when no event has the id
// (never written, or published and deleted after the retention). FAILED
// means another requeue took the event between the read and the update.
type SkippedEvent struct {
	EventID uuid.UUID
	State   State
}

// RequeueResult reports a Requeue call; both lists are in the order asked.
type RequeueResult struct {
	Requeued []RequeuedEvent
	Skipped  []SkippedEvent
	DryRun   bool
}

// Requeuer requeues FAILED events for operators: the repair of a failure
// whose cause is fixed. A FAILED event holds back the later events of its
// aggregate (the claim's ordering guard); requeued, it is again the oldest
// PENDING row of its aggregate, so the relay dispatches it, with a fresh
// attempt budget, before the events that waited behind it.
type Requeuer struct {
	requeue, notify string
}

// NewRequeuer returns a Requeuer for the outbox in the schema of WithSchema
// (default DefaultSchema); it ignores the relay's other options.
func NewRequeuer(opts ...Option) (*Requeuer, error) {
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	return &Requeuer{requeue: pgschema.Render(qRequeue, o.schema), notify: pgschema.Render(notifyChannel, o.schema)}, nil
}

// qRequeue requeues the FAILED events among $1 unless $3 (dry run), wakes
// the relays listening on $4, and reports every id asked for, in the order
// asked, with the state it had.
//
// Why it is shaped this way:
//   - One statement: the report and the change cannot disagree about which
//     rows were FAILED. The main SELECT sees the rows as they were before
//     the UPDATE (a data-modifying CTE's effect is invisible to its own
//     statement), so it reports the state and error each event had, while
//     "requeued" comes from the UPDATE's RETURNING: a row another requeue
//     took first is re-checked by the UPDATE and not reported as requeued.
//   - Only status = 'FAILED' is written. No relay holds a lock on a FAILED
//     row (claims lock PENDING rows only), so the UPDATE never waits on a
//     batch in flight, and a PENDING or leased row asked for by mistake is
//     left as it is.
//   - attempts = 0 and next_attempt_at = NULL: a fresh attempt budget,
//     claimable at once. The lease columns are cleared too: a FAILED row
//     should have none, and a stale one would keep a slow-mode claim off it.
//   - last_error keeps the old error behind the note: the row carries who
//     requeued it and why it had failed.
//   - The relays' keyset cursors are past the requeued rows: a NOTIFY as
//     Append sends, with the lowest requeued id as payload, rewinds them at
//     commit instead of leaving the rows to the next sweep. It is sent in the
//     transaction: an operator's rare requeue may hold the notification lock
//     across its commit.
//     The notified CTE is joined so that it runs; it yields one row, with
//     or without a notification.
//   - Every probe is by primary key (event_id) on both tables: at most
//     2 x MaxRequeueEvents index lookups, whatever the backlog.
const qRequeue = `
WITH asked AS (
    SELECT event_id, n FROM unnest($1::uuid[]) WITH ORDINALITY AS a(event_id, n)
),
requeued AS (
    UPDATE {schema}.outbox o
    SET status = 'PENDING', attempts = 0, next_attempt_at = NULL,
        lease_owner = NULL, lease_until = NULL, lease_alone = false,
        last_error = $2 || '; was: ' || coalesce(o.last_error, '')
    WHERE NOT $3::boolean AND o.event_id = ANY($1::uuid[]) AND o.status = 'FAILED'
    RETURNING o.event_id, o.id
),
notified AS (
    SELECT count(pg_notify($4, lowest::text)) AS n
    FROM (SELECT min(id) AS lowest FROM requeued) m
    WHERE lowest IS NOT NULL
)
SELECT a.event_id,
       CASE WHEN o.event_id IS NOT NULL THEN o.status WHEN p.event_id IS NOT NULL THEN 'PUBLISHED' ELSE '' END,
       CASE WHEN $3::boolean THEN coalesce(o.status = 'FAILED', false) ELSE r.event_id IS NOT NULL END,
       coalesce(o.id, 0), coalesce(o.aggregate_id, ''), coalesce(o.event_type, ''), coalesce(o.last_error, '')
FROM asked a
CROSS JOIN notified
LEFT JOIN {schema}.outbox o ON o.event_id = a.event_id
LEFT JOIN {schema}.outbox_published p ON p.event_id = a.event_id
LEFT JOIN requeued r ON r.event_id = a.event_id
ORDER BY a.n`

// Requeue moves the FAILED events among req.EventIDs back to PENDING (see
// qRequeue) and reports the others, untouched; a dry run reports the same
// and changes nothing. db is a pool, a connection or a transaction: pass
// the transaction of an audit record to make both one change. The relays
// are woken when the change commits.
func (q *Requeuer) Requeue(ctx context.Context, db pgdb.Executor, req RequeueRequest) (RequeueResult, error) {
	ids := make([]uuid.UUID, 0, len(req.EventIDs))
	seen := make(map[uuid.UUID]bool, len(req.EventIDs))
	for _, id := range req.EventIDs {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	switch {
	case len(ids) == 0 || len(ids) > MaxRequeueEvents:
		return RequeueResult{}, fmt.Errorf("%w: 1..%d event ids, got %d", ErrInvalidRequeue, MaxRequeueEvents, len(ids))
	case strings.TrimSpace(req.Note) == "":
		return RequeueResult{}, fmt.Errorf("%w: a note (who, which ticket) is required", ErrInvalidRequeue)
	case !utf8.ValidString(req.Note) || strings.ContainsRune(req.Note, 0):
		return RequeueResult{}, fmt.Errorf("%w: the note must be UTF-8 text without NUL", ErrInvalidRequeue)
	}
	rows, err := db.Query(ctx, q.requeue, ids, req.Note, req.DryRun, q.notify)
	if err != nil {
		return RequeueResult{}, fmt.Errorf("outbox: requeue: %w", err)
	}
	defer rows.Close()
	res := RequeueResult{DryRun: req.DryRun}
	for rows.Next() {
		var (
			ev       RequeuedEvent
			state    string
			requeued bool
		)
		if err := rows.Scan(&ev.EventID, &state, &requeued, &ev.Seq, &ev.AggregateID, &ev.Type, &ev.LastError); err != nil {
			return RequeueResult{}, fmt.Errorf("outbox: requeue: %w", err)
		}
		if !requeued {
			res.Skipped = append(res.Skipped, SkippedEvent{EventID: ev.EventID, State: State(state)})
			continue
		}
		res.Requeued = append(res.Requeued, ev)
	}
	if err := rows.Err(); err != nil {
		return RequeueResult{}, fmt.Errorf("outbox: requeue: %w", err)
	}
	return res, nil
}
