package leasequeue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// JobInfo is a job as operators see it.
type JobInfo struct {
	ID          int64      `json:"id"`
	UniqueKey   string     `json:"unique_key,omitempty"`
	State       State      `json:"state"`
	Attempts    int        `json:"attempts"`
	MaxAttempts int        `json:"max_attempts"`
	Epoch       int64      `json:"epoch"`
	LeaseOwner  string     `json:"lease_owner,omitempty"`
	DueAt       time.Time  `json:"due_at"`
	LastError   string     `json:"last_error,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
}

// ListFilter selects jobs for List.
type ListFilter struct {
	// State filters by state; empty means all.
	State State
	// BeforeID pages: only jobs with a smaller id; 0 means from the newest.
	BeforeID int64
	// Limit caps the result; 0 means 100, at most 1000.
	Limit int
	// UniqueKey, when set, lists only the job with this unique key (at
	// most one).
	UniqueKey string
}

// List returns jobs newest first.
func (q *Queue) List(ctx context.Context, db pgdb.Executor, f ListFilter) ([]JobInfo, error) {
	switch f.State {
	case "", StateAvailable, StateRunning, StateDone, StateDead:
	default:
		return nil, fmt.Errorf("leasequeue: unknown state %q (want available, running, done or dead)", f.State)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	query, args := q.sql.list, []any{q.cfg.Name, string(f.State), f.BeforeID, limit}
	if f.UniqueKey != "" {
		query, args = q.sql.listByKey, append(args, f.UniqueKey)
	}
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (JobInfo, error) {
		var j JobInfo
		var state string
		var attempts, maxAttempts int32
		err := r.Scan(&j.ID, &j.UniqueKey, &state, &attempts, &maxAttempts, &j.Epoch, &j.LeaseOwner,
			&j.DueAt, &j.LastError, &j.CreatedAt, &j.FinishedAt)
		j.State, j.Attempts, j.MaxAttempts = State(state), int(attempts), int(maxAttempts)
		return j, err
	})
	if err != nil {
		return nil, fmt.Errorf("leasequeue: list: %w", err)
	}
	return out, nil
}

// ErrAuditRequired is returned by Retry without a ticket or an actor: a
// repair of parked work is privileged and must be attributable (I6).
var ErrAuditRequired = errors.New("leasequeue: a ticket and an actor are required")

// Retry requeues parked (dead) jobs with a fresh attempt budget, writing one
// leasequeue_job_audit row per job in the same transaction. The jobs then
// take the normal path: claim, fenced completion. Ids that are not parked are
// not touched; the ids actually requeued are returned.
func (q *Queue) Retry(ctx context.Context, ids []int64, ticket, actor string) ([]int64, error) {
	ticket, actor = strings.TrimSpace(ticket), strings.TrimSpace(actor)
	if ticket == "" || actor == "" {
		return nil, ErrAuditRequired
	}
	if len(ids) == 0 {
		return nil, errors.New("leasequeue: retry: no job ids")
	}
	var out []int64
	err := pgx.BeginFunc(ctx, q.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q.sql.retry, q.cfg.Name, ids, q.now(), ticket, actor)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "SELECT pg_notify($1, '')", q.channel)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("leasequeue: retry: %w", err)
	}
	q.logger.Info("parked jobs requeued by operator", "ticket", ticket, "actor", actor,
		"requested", ids, "requeued", out)
	return out, nil
}

// RetryDryRun reports which of ids Retry would requeue now (the dead jobs
// of this queue) and changes nothing, for an operator's dry run. A job may
// change state before the real Retry, which returns what it requeued.
func (q *Queue) RetryDryRun(ctx context.Context, db pgdb.Executor, ids []int64) ([]int64, error) {
	if len(ids) == 0 {
		return nil, errors.New("leasequeue: retry: no job ids")
	}
	rows, err := db.Query(ctx, q.sql.retryable, q.cfg.Name, ids)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: retry dry run: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("leasequeue: retry dry run: %w", err)
	}
	return out, nil
}

// statsCountCap bounds every count of Stats.
const statsCountCap = 100000

// Stats is a snapshot of a queue's health (I7). Counts are capped at 100000.
type Stats struct {
	Available int64
	Running   int64
	// ExpiredLeases are running jobs whose lease passed: their worker died or
	// stalls. Rescue brings it back to zero within the RescueInterval.
	ExpiredLeases int64
	// Dead jobs are parked and wait for an operator.
	Dead int64
	// OldestAvailableAge is how long the oldest due job has waited.
	OldestAvailableAge time.Duration
}

// Stats reads the queue's health counts.
func (q *Queue) Stats(ctx context.Context, db pgdb.Executor) (Stats, error) {
	var s Stats
	var oldest *time.Time
	now := q.now()
	err := db.QueryRow(ctx, q.sql.stats, q.cfg.Name, now, statsCountCap).Scan(&s.Available, &s.Running, &s.ExpiredLeases, &s.Dead, &oldest)
	if err != nil {
		return Stats{}, fmt.Errorf("leasequeue: stats: %w", err)
	}
	if oldest != nil {
		s.OldestAvailableAge = max(now.Sub(*oldest), 0)
	}
	return s, nil
}
