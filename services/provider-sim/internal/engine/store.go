package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/services/provider-sim/internal/faults"
)

// Job statuses (jobs.status).
const (
	statusAccepted  = "ACCEPTED"
	statusExecuting = "EXECUTING"
	statusCompleted = "COMPLETED"
	statusDone      = "DONE"
)

// errLeaseLost: a fenced write matched no row, so another worker owns the job
// now. The worker abandons the job without touching it again.
var errLeaseLost = errors.New("lease lost")

// job is a claimed (or just accepted) job, as its worker sees it.
type job struct {
	ID          uuid.UUID
	WorkOrderID uuid.UUID
	CustomerID  string
	Description string
	Positions   int32
	Status      string
	RunFor      time.Duration
	// Remaining execution time when claimed (RunFor minus time since start).
	Remaining    time.Duration
	AcceptedAt   time.Time
	Plan         faults.Plan
	CrashPending bool
	// LeaseToken fences every write of this worker.
	LeaseToken int64
	// Attempts counts earlier technical failures (for the retry backoff).
	Attempts int
	// Traceparent and Tracestate of the SubmitWorkOrder call that created
	// the job; the execution's span links to it.
	Traceparent, Tracestate string
}

const jobColumns = `job_id, work_order_id, customer_id, description, positions, status, run_for_us,
	CASE WHEN started_at IS NULL THEN run_for_us
	     ELSE greatest(0, run_for_us - (extract(epoch FROM clock_timestamp() - started_at) * 1000000)::bigint) END,
	accepted_at, fault_early_completion, fault_duplicate, fault_split_first, fault_poison, fault_unknown_order,
	fault_crash_pending, lease_token, attempts, traceparent, tracestate`

func scanJob(row pgx.Row) (*job, error) {
	var j job
	var runUS, remainingUS int64
	var poison string
	err := row.Scan(&j.ID, &j.WorkOrderID, &j.CustomerID, &j.Description, &j.Positions, &j.Status, &runUS,
		&remainingUS, &j.AcceptedAt, &j.Plan.EarlyCompletion, &j.Plan.Duplicate, &j.Plan.SplitFirst, &poison,
		&j.Plan.UnknownOrder, &j.CrashPending, &j.LeaseToken, &j.Attempts, &j.Traceparent, &j.Tracestate)
	if err != nil {
		return nil, err
	}
	j.RunFor = time.Duration(runUS) * time.Microsecond
	j.Remaining = time.Duration(remainingUS) * time.Microsecond
	j.Plan.Poison = faults.Poison(poison)
	j.Plan.PublishThenCrash = j.CrashPending
	return &j, nil
}

// Concurrent identical submissions all reach this INSERT: the unique key
// makes exactly one of them insert, the others wait for its commit and do
// nothing; each then reads the winner's row (selectJobByWorkOrder) in a new
// statement snapshot. An early-completion job is inserted already leased by
// the submitting call (lease_token 1), so no worker publishes it concurrently.
const insertJob = `
INSERT INTO jobs (job_id, work_order_id, customer_id, description, positions, status, run_for_us,
                  started_at, completed_at,
                  fault_early_completion, fault_duplicate, fault_split_first, fault_poison,
                  fault_unknown_order, fault_crash_pending, lease_owner, lease_until, lease_token,
                  traceparent, tracestate)
VALUES ($1, $2, $3, $4, $5, $6, $7,
        CASE WHEN $8::boolean THEN now() END, CASE WHEN $8::boolean THEN now() END,
        $8, $9, $10, $11, $12, $13,
        CASE WHEN $8::boolean THEN $14 END,
        CASE WHEN $8::boolean THEN now() + $15::bigint * interval '1 microsecond' END,
        CASE WHEN $8::boolean THEN 1 ELSE 0 END,
        $16, $17)
ON CONFLICT (work_order_id) DO NOTHING
RETURNING ` + jobColumns

const selectJobByWorkOrder = `SELECT ` + jobColumns + ` FROM jobs WHERE work_order_id = $1`

// The inner SELECT picks one due, unleased (or expired-lease) job; SKIP
// LOCKED lets concurrent workers and other instances pass over rows another
// claim is taking instead of queueing behind it. After the commit the row
// lock is gone and the lease alone marks ownership, so a crashed owner's job
// becomes claimable when its lease expires. lease_token increments on every
// claim: it is the fencing token all later writes of the owner check.
// ORDER BY not_before on the partial index jobs_unfinished: oldest due first.
const claimJob = `
UPDATE jobs SET lease_owner = $1,
                lease_until = now() + $2::bigint * interval '1 microsecond',
                lease_token = lease_token + 1
 WHERE job_id = (
        SELECT job_id FROM jobs
         WHERE status <> 'DONE' AND not_before <= now()
           AND (lease_until IS NULL OR lease_until < now())
         ORDER BY not_before
         LIMIT 1
         FOR UPDATE SKIP LOCKED)
RETURNING ` + jobColumns

// releaseInstance gives back, at an instance's start, the jobs a previous
// incarnation of the same instance still holds: that process is dead (this
// one replaced it), so waiting out its leases would only delay the work. The
// token bump fences the dead incarnation off at once, before anyone claims
// the job again. attempts stays as it is: here it counts technical failures
// (the retry backoff), and a publish_then_crash fault is disarmed before it
// fires, so the job that killed the process does not kill the next one.
// starts_with, not LIKE: an instance name may contain '_'; the '/' keeps
// "provider-1" from matching "provider-10/…". status <> 'DONE' lets the scan
// use the partial index jobs_unfinished; leased jobs are few.
const releaseInstance = `
UPDATE jobs SET lease_owner = NULL, lease_until = NULL, lease_token = lease_token + 1,
       last_error = 'lease held by ' || lease_owner || ' released when instance ' || $1 || ' restarted'
           || coalesce(' (previous error: ' || last_error || ')', '')
 WHERE status <> 'DONE' AND starts_with(lease_owner, $1 || '/') AND lease_owner <> $2`

// Every write of the owner below is fenced by "lease_token = $2".
const (
	renewLease = `UPDATE jobs SET lease_until = now() + $3::bigint * interval '1 microsecond'
 WHERE job_id = $1 AND lease_token = $2`

	markStarted = `UPDATE jobs SET status = 'EXECUTING', started_at = now()
 WHERE job_id = $1 AND lease_token = $2 AND status = 'ACCEPTED'`

	markCompleted = `UPDATE jobs SET status = 'COMPLETED', completed_at = now()
 WHERE job_id = $1 AND lease_token = $2 AND status = 'EXECUTING'`

	markDone = `UPDATE jobs SET status = 'DONE', lease_owner = NULL, lease_until = NULL, last_error = NULL
 WHERE job_id = $1 AND lease_token = $2`

	// Committed BEFORE the publish that crashes: the restarted process sees
	// the fault as spent and republishes instead of crashing again.
	disarmCrash = `UPDATE jobs SET fault_crash_pending = false WHERE job_id = $1 AND lease_token = $2`

	// Graceful shutdown hands the job back at once (no wait for expiry).
	releaseJob = `UPDATE jobs SET lease_owner = NULL, lease_until = NULL WHERE job_id = $1 AND lease_token = $2`

	// A technical failure: release and retry after a backoff.
	retryJob = `UPDATE jobs SET lease_owner = NULL, lease_until = NULL, attempts = attempts + 1, last_error = $3,
                not_before = now() + $4::bigint * interval '1 microsecond'
 WHERE job_id = $1 AND lease_token = $2`

	// ON CONFLICT: the rows' ids are derived from the fact, so rebuilding
	// them after a lost lease inserts nothing new.
	insertEvent = `INSERT INTO job_events (event_id, job_id, seq, kind, event_type, ordering_key, payload, copies, occurred_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (event_id) DO NOTHING`

	selectUnpublished = `SELECT event_id, seq, kind, event_type, ordering_key, payload, copies, occurred_at
  FROM job_events WHERE job_id = $1 AND published_at IS NULL ORDER BY seq`

	// Fenced through the job row: a worker that lost its lease may still have
	// published (a duplicate with the same event_id, which consumers absorb)
	// but does not record it.
	markPublished = `UPDATE job_events e SET published_at = now(), publish_count = e.publish_count + e.copies
  FROM jobs j
 WHERE e.event_id = $1 AND j.job_id = e.job_id AND j.lease_token = $2`
)

// store runs the queries above.
type store struct {
	pool *pgxpool.Pool
}

// fenced runs one write of the lease owner and reports errLeaseLost when it
// matched nothing.
func (s store) fenced(ctx context.Context, q pgxExec, sql string, args ...any) error {
	tag, err := q.Exec(ctx, sql, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errLeaseLost
	}
	return nil
}

type pgxExec interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func (s store) insertEvents(ctx context.Context, tx pgx.Tx, jobID uuid.UUID, rows []eventRow) error {
	for _, r := range rows {
		if _, err := tx.Exec(ctx, insertEvent, r.EventID, jobID, r.Seq, r.Kind, r.EventType, r.OrderingKey,
			r.Payload, r.Copies, r.OccurredAt); err != nil {
			return fmt.Errorf("record %s event %s: %w", r.Kind, r.EventID, err)
		}
	}
	return nil
}

func (s store) unpublished(ctx context.Context, jobID uuid.UUID) ([]eventRow, error) {
	rows, err := s.pool.Query(ctx, selectUnpublished, jobID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (eventRow, error) {
		var e eventRow
		err := r.Scan(&e.EventID, &e.Seq, &e.Kind, &e.EventType, &e.OrderingKey, &e.Payload, &e.Copies, &e.OccurredAt)
		return e, err
	})
}
