package engine

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgdb"
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
	// Started is the STARTED message of a job this owner's claim started,
	// committed with the claim and not published yet; nil for a job resumed
	// or completed early.
	Started *eventRow
}

const jobColumns = `job_id, work_order_id, customer_id, description, positions, status, run_for_us,
	CASE WHEN started_at IS NULL THEN run_for_us
	     ELSE greatest(0, run_for_us - (extract(epoch FROM clock_timestamp() - started_at) * 1000000)::bigint) END,
	accepted_at, fault_early_completion, fault_duplicate, fault_split_first, fault_poison, fault_unknown_order,
	fault_crash_pending, lease_token, attempts, traceparent, tracestate`

// scanJob scans jobColumns, then extra (the claim's further columns).
func scanJob(row pgx.Row, extra ...any) (*job, error) {
	var j job
	var runUS, remainingUS int64
	var poison string
	err := row.Scan(append([]any{&j.ID, &j.WorkOrderID, &j.CustomerID, &j.Description, &j.Positions, &j.Status, &runUS,
		&remainingUS, &j.AcceptedAt, &j.Plan.EarlyCompletion, &j.Plan.Duplicate, &j.Plan.SplitFirst, &poison,
		&j.Plan.UnknownOrder, &j.CrashPending, &j.LeaseToken, &j.Attempts, &j.Traceparent, &j.Tracestate}, extra...)...)
	if err != nil {
		return nil, err
	}
	j.RunFor = time.Duration(runUS) * time.Microsecond
	j.Remaining = time.Duration(remainingUS) * time.Microsecond
	j.Plan.Poison = faults.Poison(poison)
	j.Plan.PublishThenCrash = j.CrashPending
	return &j, nil
}

// Every submission, a repeat too, reaches this INSERT: the unique key makes
// exactly one of them insert; the others (waiting for its commit when it is
// concurrent) do nothing and read the winner's row (selectJobByWorkOrder) in
// a new statement snapshot. An early-completion job is inserted already
// leased by the submitting call (lease_token 1), so no worker publishes it
// concurrently.
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

// The pick takes up to $3 due, unleased (or expired-lease) jobs; SKIP LOCKED
// lets other instances pass over rows another claim is taking instead of
// queueing behind it. MATERIALIZED evaluates the pick once (inlined, it
// could be planned as a join that re-reads it) and keeps each job's status
// before the claim: a job still ACCEPTED is started by the claim (status,
// started_at), and the claim's transaction inserts its STARTED message
// before it commits (insertEvents), so the start costs no commit of its own
// (ADR 0012, revision 2). After the commit the row locks are gone and the
// lease alone marks ownership, so a crashed owner's job becomes claimable
// when its lease expires. lease_token increments on every claim: it is the
// fencing token all later writes of the owner check. ORDER BY not_before on
// the partial index jobs_unfinished: oldest due first. Besides the job, a
// row returns whether this claim started it, and its started_at.
const claimJobs = `
WITH picked AS MATERIALIZED (
  SELECT job_id AS id, status AS was FROM jobs
   WHERE status <> 'DONE' AND not_before <= now()
     AND (lease_until IS NULL OR lease_until < now())
   ORDER BY not_before
   LIMIT $3
   FOR UPDATE SKIP LOCKED)
UPDATE jobs SET lease_owner = $1,
                lease_until = now() + $2::bigint * interval '1 microsecond',
                lease_token = lease_token + 1,
                status = CASE WHEN picked.was = 'ACCEPTED' THEN 'EXECUTING' ELSE status END,
                started_at = CASE WHEN picked.was = 'ACCEPTED' THEN now() ELSE started_at END
  FROM picked
 WHERE job_id = picked.id
RETURNING ` + jobColumns + `, picked.was = 'ACCEPTED', started_at`

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

// Every write of the owner below is fenced by "lease_token = $2". The
// statements that end a step (record it, finish, release, retry) also record
// the messages the owner published since its last write ($3 event ids, $4
// publish times: markOut), so a step costs one statement and one commit
// whatever it publishes. Each is one statement: its CTEs commit together or
// not at all, and "SELECT count(*) FROM job" is 0 when the fence refused.
const (
	renewLease = `UPDATE jobs SET lease_until = now() + $3::bigint * interval '1 microsecond'
 WHERE job_id = $1 AND lease_token = $2`

	// markOut records the publishes of $3/$4, fenced through the job CTE:
	// an owner that lost its lease may still have published (a duplicate
	// with the same event_id, which consumers absorb) but records nothing.
	markOut = `
marked AS (
  UPDATE job_events e SET published_at = o.at, publish_count = e.publish_count + e.copies
    FROM job, unnest($3::uuid[], $4::timestamptz[]) AS o(event_id, at)
   WHERE e.job_id = job.job_id AND e.event_id = o.event_id)
SELECT count(*) FROM job`

	// recordEvents inserts $5..$12, the messages a step produces, before
	// they are published. ON CONFLICT: the rows' ids are derived from the
	// fact, so rebuilding them after a lost lease inserts nothing new.
	recordEvents = `
events AS (
  INSERT INTO job_events (event_id, job_id, seq, kind, event_type, ordering_key, payload, copies, occurred_at)
  SELECT r.event_id, job.job_id, r.seq, r.kind, r.event_type, r.ordering_key, r.payload, r.copies, r.occurred_at
    FROM job, unnest($5::uuid[], $6::int[], $7::text[], $8::text[], $9::text[], $10::bytea[], $11::int[], $12::timestamptz[])
         AS r(event_id, seq, kind, event_type, ordering_key, payload, copies, occurred_at)
  ON CONFLICT (event_id) DO NOTHING),`

	recordCompleted = `
WITH job AS (
  UPDATE jobs SET status = 'COMPLETED', completed_at = now()
   WHERE job_id = $1 AND lease_token = $2 AND status = 'EXECUTING'
  RETURNING job_id),` + recordEvents + markOut

	finishJob = `
WITH job AS (
  UPDATE jobs SET status = 'DONE', lease_owner = NULL, lease_until = NULL, last_error = NULL
   WHERE job_id = $1 AND lease_token = $2
  RETURNING job_id),` + markOut

	// Graceful shutdown hands the job back at once (no wait for expiry).
	releaseJob = `
WITH job AS (
  UPDATE jobs SET lease_owner = NULL, lease_until = NULL
   WHERE job_id = $1 AND lease_token = $2
  RETURNING job_id),` + markOut

	// A technical failure: release and retry after a backoff.
	retryJob = `
WITH job AS (
  UPDATE jobs SET lease_owner = NULL, lease_until = NULL, attempts = attempts + 1, last_error = $5,
                  not_before = now() + $6::bigint * interval '1 microsecond'
   WHERE job_id = $1 AND lease_token = $2
  RETURNING job_id),` + markOut

	// Committed BEFORE the publish that crashes: the restarted process sees
	// the fault as spent and republishes instead of crashing again.
	disarmCrash = `UPDATE jobs SET fault_crash_pending = false WHERE job_id = $1 AND lease_token = $2`

	// insertEvents records the messages of jobs whose rows the transaction
	// holds locked (a claim's STARTED messages; an early completion's
	// messages with its job), so it needs no fence. ON CONFLICT as in
	// recordEvents.
	insertEvents = `INSERT INTO job_events (job_id, event_id, seq, kind, event_type, ordering_key, payload, copies, occurred_at)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::int[], $9::timestamptz[])
ON CONFLICT (event_id) DO NOTHING`

	// Read only by an owner that resumes a job (claimed when already
	// EXECUTING or COMPLETED): a fresh step publishes the rows it has just
	// recorded.
	selectUnpublished = `SELECT event_id, seq, kind, event_type, ordering_key, payload, copies, occurred_at
  FROM job_events WHERE job_id = $1 AND published_at IS NULL ORDER BY seq`
)

// store runs the queries above.
type store struct {
	db pgdb.Executor
}

// fenced runs one write of the lease owner and reports errLeaseLost when it
// matched nothing.
func (s store) fenced(ctx context.Context, sql string, args ...any) error {
	tag, err := s.db.Exec(ctx, sql, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errLeaseLost
	}
	return nil
}

// published is a message this owner published and has not recorded yet.
type published struct {
	EventID uuid.UUID
	At      time.Time
}

// step runs one of the step statements above for the owner of j: out are
// the publishes it records, extra the statement's parameters from $5 on.
func (s store) step(ctx context.Context, sql string, j *job, out []published, extra ...any) error {
	ids := make([]uuid.UUID, len(out))
	ats := make([]time.Time, len(out))
	for i, p := range out {
		ids[i], ats[i] = p.EventID, p.At
	}
	var n int
	if err := s.db.QueryRow(ctx, sql, append([]any{j.ID, j.LeaseToken, ids, ats}, extra...)...).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return errLeaseLost
	}
	return nil
}

// record runs recordCompleted: the step, its messages and the publishes
// before it, in one statement.
func (s store) record(ctx context.Context, sql string, j *job, out []published, rows []eventRow) error {
	return s.step(ctx, sql, j, out, eventColumns(rows)...)
}

// eventColumns are rows as the arrays the statements unnest: event ids,
// seqs, kinds, event types, ordering keys, payloads, copies, occurred_at.
func eventColumns(rows []eventRow) []any {
	n := len(rows)
	var (
		ids       = make([]uuid.UUID, n)
		seqs      = make([]int32, n)
		kinds     = make([]string, n)
		types     = make([]string, n)
		keys      = make([]string, n)
		payloads  = make([][]byte, n)
		copies    = make([]int32, n)
		occurreds = make([]time.Time, n)
	)
	for i, r := range rows {
		ids[i], seqs[i], kinds[i], types[i], keys[i] = r.EventID, int32(r.Seq), r.Kind, r.EventType, r.OrderingKey
		payloads[i], copies[i], occurreds[i] = r.Payload, int32(r.Copies), r.OccurredAt
	}
	return []any{ids, seqs, kinds, types, keys, payloads, copies, occurreds}
}

// insertEventsArgs are insertEvents' parameters: jobIDs[i] is rows[i]'s job.
func insertEventsArgs(jobIDs []uuid.UUID, rows []eventRow) []any {
	return append([]any{jobIDs}, eventColumns(rows)...)
}

func (s store) unpublished(ctx context.Context, jobID uuid.UUID) ([]eventRow, error) {
	rows, err := s.db.Query(ctx, selectUnpublished, jobID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (eventRow, error) {
		var e eventRow
		err := r.Scan(&e.EventID, &e.Seq, &e.Kind, &e.EventType, &e.OrderingKey, &e.Payload, &e.Copies, &e.OccurredAt)
		return e, err
	})
}
