package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// Operator limits (I6): a replay is always bounded, so nobody reopens
// "everything" by accident.
const (
	// MaxReplayCount caps the entries one replay may reopen.
	MaxReplayCount = 1000
	// MaxReplaySpan caps the received_at range of a time-range replay.
	MaxReplaySpan = 7 * 24 * time.Hour
	// DefaultRetention keeps resolved entries 31 days: the longest any
	// Pub/Sub subscription (including a dead-letter one) can retain and
	// redeliver a message, so every message the broker may still hand us
	// finds its row and dedups at insert. (Correctness does not depend on it:
	// the correlation also recognises applied events after cleanup, F6.)
	DefaultRetention = 31 * 24 * time.Hour
	// DefaultCleanupBatch is the rows deleted per statement: small enough to
	// keep locks and WAL bursts short, large enough to keep up.
	DefaultCleanupBatch = 1000
)

// Ops are the privileged operator actions on the inbox. Every mutating
// action (Replay, Cleanup; dry runs too) needs a ticket and an actor and is
// audited in the same transaction as its effect: a row in
// {schema}.inbox_audit, or whatever WithAudit does instead.
type Ops struct {
	db    pgdb.DB
	q     queries
	audit AuditFunc
}

// NewOps returns the operator actions on db. Of the options it uses
// WithSchema and WithAudit.
func NewOps(db pgdb.DB, opts ...Option) (*Ops, error) {
	if db == nil {
		return nil, errors.New("inbox: NewOps needs a database handle")
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	ops := &Ops{db: db, q: newQueries(o.schema), audit: o.audit}
	if ops.audit == nil {
		ops.audit = ops.insertAudit
	}
	return ops, nil
}

// ListFilter selects entries for List.
type ListFilter struct {
	// Status to list; empty means PARKED (the operator's usual question).
	Status Status
	// Reason restricts PARKED entries to one park reason.
	Reason string
	// AfterID pages: only entries with a larger id.
	AfterID int64
	// Limit caps the result; 0 means 50, at most 1000.
	Limit int
	// Source and EventIDs, when EventIDs is set, list only the entries of
	// these event ids from this source, in every status unless Status is
	// set: one probe of the (source, event_id) key each, whatever the
	// status (the correlation key is indexed only while OPEN).
	Source   string
	EventIDs []string
}

// listEntries pages by id. For PARKED it uses inbox_parked_idx's predicate;
// the other statuses by their own partial indexes or the primary key.
const listEntries = `
SELECT ` + entryColumns + `
FROM {schema}.inbox
WHERE status = $1 AND ($2 = '' OR park_reason = $2) AND id > $3
ORDER BY id
LIMIT $4`

// listByEvent is listEntries for ListFilter.EventIDs.
const listByEvent = `
SELECT ` + entryColumns + `
FROM {schema}.inbox
WHERE source = $5 AND event_id = ANY($6::text[])
  AND ($1 = '' OR status = $1) AND ($2 = '' OR park_reason = $2) AND id > $3
ORDER BY id
LIMIT $4`

// List returns entries matching f, oldest first.
func (o *Ops) List(ctx context.Context, f ListFilter) ([]Entry, error) {
	if f.Status == "" && len(f.EventIDs) == 0 {
		f.Status = StatusParked
	}
	if f.Limit <= 0 {
		f.Limit = 50
	}
	f.Limit = min(f.Limit, 1000)
	query, args := o.q.listEntries, []any{string(f.Status), f.Reason, f.AfterID, f.Limit}
	if len(f.EventIDs) > 0 {
		query, args = o.q.listByEvent, append(args, f.Source, f.EventIDs)
	}
	rows, err := o.db.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// ErrNotFound is returned by Get for an unknown id.
var ErrNotFound = errors.New("inbox: entry not found")

const getEntry = `SELECT ` + entryColumns + ` FROM {schema}.inbox WHERE id = $1`

// Get returns one entry.
func (o *Ops) Get(ctx context.Context, id int64) (Entry, error) {
	e, err := scanEntry(o.db.QueryRow(ctx, o.q.getEntry, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, ErrNotFound
	}
	return e, err
}

// Authorization is who asks for a privileged action and why.
type Authorization struct {
	// Ticket is the change/incident reference (required).
	Ticket string
	// Actor is the person or system acting (required).
	Actor string
}

// Validate requires both fields.
func (a Authorization) Validate() error {
	var errs []error
	if strings.TrimSpace(a.Ticket) == "" {
		errs = append(errs, errors.New("ticket is required"))
	}
	if strings.TrimSpace(a.Actor) == "" {
		errs = append(errs, errors.New("actor is required"))
	}
	if len(a.Ticket) > 200 || len(a.Actor) > 200 {
		errs = append(errs, errors.New("ticket and actor are at most 200 characters"))
	}
	return errors.Join(errs...)
}

// ReplayRequest selects PARKED entries to reopen: either IDs, or a
// received_at range [From, To) optionally narrowed by Reason.
type ReplayRequest struct {
	Authorization
	IDs      []int64
	From, To time.Time
	Reason   string
	// DryRun reports what would be reopened and changes nothing (audited too).
	DryRun bool
}

// ReplayResult lists the affected entries.
type ReplayResult struct {
	// IDs of the entries reopened (or, on a dry run, that would be).
	IDs    []int64
	DryRun bool
}

// ErrInvalidRequest wraps every refusal of an operator request.
var ErrInvalidRequest = errors.New("inbox: invalid operator request")

// Validate refuses unbounded or ambiguous replays.
func (r ReplayRequest) Validate() error {
	if err := r.Authorization.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	byTime := !r.From.IsZero() || !r.To.IsZero()
	switch {
	case len(r.IDs) > 0 && byTime:
		return fmt.Errorf("%w: give either ids or a time range, not both", ErrInvalidRequest)
	case len(r.IDs) > MaxReplayCount:
		return fmt.Errorf("%w: at most %d ids per replay", ErrInvalidRequest, MaxReplayCount)
	case len(r.IDs) > 0:
		return nil
	case r.From.IsZero() || r.To.IsZero():
		return fmt.Errorf("%w: a replay needs explicit ids or both ends of a time range (no 'replay everything')", ErrInvalidRequest)
	case !r.From.Before(r.To):
		return fmt.Errorf("%w: from must be before to", ErrInvalidRequest)
	case r.To.Sub(r.From) > MaxReplaySpan:
		return fmt.Errorf("%w: the time range spans more than %s", ErrInvalidRequest, MaxReplaySpan)
	}
	return nil
}

// selectReplay locks the PARKED entries a replay targets. Only PARKED rows
// match, which makes a replay idempotent: a second identical replay finds
// them OPEN or resolved and changes nothing. LIMIT max+1 detects a range
// that is too large without counting it all.
const selectReplay = `
SELECT id FROM {schema}.inbox
WHERE status = 'PARKED'
  AND (cardinality($1::bigint[]) = 0 OR id = ANY($1))
  AND (cardinality($1::bigint[]) > 0 OR (received_at >= $2 AND received_at < $3))
  AND ($4 = '' OR park_reason = $4)
ORDER BY id
LIMIT $5
FOR UPDATE`

// reopen is the runbook's one-line SQL repair, applied to a checked id list:
// the entry goes back through the normal relay path.
const reopen = `
UPDATE {schema}.inbox SET status = 'OPEN', attempts = 0, next_attempt_at = now()
WHERE id = ANY($1) AND status = 'PARKED'`

const insertAudit = `
INSERT INTO {schema}.inbox_audit (action, actor, ticket, dry_run, params, affected)
VALUES ($1, $2, $3, $4, $5, $6)`

// AuditRecord is one audited operator action.
type AuditRecord struct {
	// Action names it: "inbox.replay", "inbox.cleanup".
	Action string
	// Authorization is who acted, under which ticket.
	Authorization
	// DryRun: the action reported what it would do and changed nothing.
	DryRun bool
	// Params are the request's parameters and results, as JSON.
	Params map[string]any
	// Affected counts the entries changed (or, on a dry run, that would be).
	Affected int
}

// AuditFunc records rec inside tx, the transaction of the action: an error
// rolls the action back, so no action happens unaudited.
type AuditFunc func(ctx context.Context, tx pgx.Tx, rec AuditRecord) error

// Audit records rec in tx through the audit the Ops were built with, so
// that a service can add its own privileged actions to the same trail.
func (o *Ops) Audit(ctx context.Context, tx pgx.Tx, rec AuditRecord) error {
	return o.audit(ctx, tx, rec)
}

// insertAudit is the default AuditFunc: a row in {schema}.inbox_audit.
func (o *Ops) insertAudit(ctx context.Context, tx pgx.Tx, rec AuditRecord) error {
	p, err := json.Marshal(rec.Params)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, o.q.insertAudit, rec.Action, rec.Actor, rec.Ticket, rec.DryRun, p, rec.Affected)
	return err
}

// Replay reopens the selected PARKED entries (status OPEN, attempts 0, due
// now) and audits it (action "inbox.replay"). The relay then applies them through the same handler
// as any new entry.
func (o *Ops) Replay(ctx context.Context, req ReplayRequest) (ReplayResult, error) {
	if err := req.Validate(); err != nil {
		return ReplayResult{}, err
	}
	res := ReplayResult{DryRun: req.DryRun}
	err := pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
		ids := req.IDs
		if ids == nil {
			ids = []int64{}
		}
		rows, err := tx.Query(ctx, o.q.selectReplay, ids, req.From, req.To, req.Reason, MaxReplayCount+1)
		if err != nil {
			return err
		}
		res.IDs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if len(res.IDs) > MaxReplayCount {
			return fmt.Errorf("%w: more than %d parked entries match; narrow the range", ErrInvalidRequest, MaxReplayCount)
		}
		if !req.DryRun && len(res.IDs) > 0 {
			if _, err := tx.Exec(ctx, o.q.reopen, res.IDs); err != nil {
				return err
			}
		}
		return o.audit(ctx, tx, AuditRecord{Action: "inbox.replay", Authorization: req.Authorization, DryRun: req.DryRun,
			Params: map[string]any{
				"ids": req.IDs, "from": timeOrNil(req.From), "to": timeOrNil(req.To), "reason": req.Reason, "reopened": res.IDs,
			}, Affected: len(res.IDs)})
	})
	if err != nil {
		return ReplayResult{}, fmt.Errorf("inbox: replay: %w", err)
	}
	return res, nil
}

func timeOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// CleanupRequest deletes resolved entries.
type CleanupRequest struct {
	Authorization
	// Retention: only entries resolved longer ago are deleted. Default
	// DefaultRetention; at least MinRetention (24h), so a mistyped value
	// cannot wipe yesterday's evidence, at most MaxRetention (10 years). An
	// API taking hours converts them with RetentionFromHours.
	Retention time.Duration
	// BatchSize rows per statement. Default DefaultCleanupBatch.
	BatchSize int
	// MaxBatches bounds one run. Default 1000.
	MaxBatches int
	// DryRun counts (up to BatchSize*MaxBatches) instead of deleting.
	DryRun bool
}

// deleteResolved removes one batch. Only APPLIED and DUPLICATE rows are ever
// selected: PARKED (and OPEN) rows are never deleted, whatever their age.
// The subselect walks inbox_resolved_idx oldest first; SKIP LOCKED keeps
// cleanup out of the relay's way.
const deleteResolved = `
DELETE FROM {schema}.inbox WHERE id IN (
    SELECT id FROM {schema}.inbox
    WHERE status IN ('APPLIED', 'DUPLICATE') AND processed_at < now() - make_interval(secs => $1)
    ORDER BY processed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)`

const countResolved = `
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.inbox
    WHERE status IN ('APPLIED', 'DUPLICATE') AND processed_at < now() - make_interval(secs => $1)
    LIMIT $2) s`

// MinRetention is the smallest retention Cleanup accepts.
const MinRetention = 24 * time.Hour

// MaxRetention is the largest: ten years (87600h). A larger value is a
// mistake, and an hour count past about 2.5 million overflows time.Duration
// into an arbitrary one, as short as a day.
const MaxRetention = 87600 * time.Hour

// RetentionFromHours converts an API's retention_hours (0: DefaultRetention)
// into a retention, bounding the count before multiplying so that no value
// can overflow time.Duration. The error wraps ErrInvalidRequest.
func RetentionFromHours(hours int64) (time.Duration, error) {
	if hours == 0 {
		return DefaultRetention, nil
	}
	minH, maxH := int64(MinRetention/time.Hour), int64(MaxRetention/time.Hour)
	if hours < minH || hours > maxH {
		return 0, fmt.Errorf("%w: retention_hours must be within %d..%d (or 0 for the default), got %d",
			ErrInvalidRequest, minH, maxH, hours)
	}
	return time.Duration(hours) * time.Hour, nil
}

// checkRetention bounds a retention on both sides.
func checkRetention(retention time.Duration) error {
	if retention < MinRetention || retention > MaxRetention {
		return fmt.Errorf("%w: retention %s is outside %s..%s", ErrInvalidRequest, retention, MinRetention, MaxRetention)
	}
	return nil
}

// Cleanup deletes resolved entries older than the retention in bounded
// batches (one short transaction each) and audits the run (action
// "inbox.cleanup", after the batches). It never deletes
// PARKED entries. It returns the rows deleted (or, on a dry run, that would be).
func (o *Ops) Cleanup(ctx context.Context, req CleanupRequest) (int, error) {
	if err := req.Validate(); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if req.Retention == 0 {
		req.Retention = DefaultRetention
	}
	if err := checkRetention(req.Retention); err != nil {
		return 0, err
	}
	if req.BatchSize <= 0 {
		req.BatchSize = DefaultCleanupBatch
	}
	if req.MaxBatches <= 0 {
		req.MaxBatches = 1000
	}
	total, err := o.cleanup(ctx, req.Retention, req.BatchSize, req.MaxBatches, req.DryRun)
	if err != nil {
		return total, err
	}
	err = pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
		return o.audit(ctx, tx, AuditRecord{Action: "inbox.cleanup", Authorization: req.Authorization, DryRun: req.DryRun,
			Params: map[string]any{"retention": req.Retention.String(), "batch_size": req.BatchSize}, Affected: total})
	})
	return total, err
}

// CleanupResolved is the unattended form (a periodic worker): same
// statement, no audit row (it is policy, not an operator decision).
func (o *Ops) CleanupResolved(ctx context.Context, retention time.Duration, batchSize, maxBatches int) (int, error) {
	if err := checkRetention(retention); err != nil {
		return 0, err
	}
	return o.cleanup(ctx, retention, batchSize, maxBatches, false)
}

func (o *Ops) cleanup(ctx context.Context, retention time.Duration, batchSize, maxBatches int, dryRun bool) (int, error) {
	secs := retention.Seconds()
	if dryRun {
		var n int
		err := o.db.QueryRow(ctx, o.q.countResolved, secs, batchSize*maxBatches).Scan(&n)
		return n, err
	}
	total := 0
	for range maxBatches {
		tag, err := o.db.Exec(ctx, o.q.deleteResolved, secs, batchSize)
		if err != nil {
			return total, fmt.Errorf("inbox: cleanup: %w", err)
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < int64(batchSize) {
			break
		}
	}
	return total, nil
}
