package leasequeue

import (
	"fmt"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// The SQL of the queue. Every statement that writes a running job carries the
// fencing predicate (id AND epoch AND state = 'running') and the caller checks
// which rows it affected; without the epoch, a worker whose lease was taken
// over could still write (the state is 'running' again, for the new owner).
// The fenced writes of a claim (heartbeat, done mark, failure, release) sit
// beside their callers in lease.go. The constants name the tables
// {schema}.leasequeue_jobs and {schema}.leasequeue_job_audit; New renders
// them once with the schema of WithSchema.

// queries are the statements rendered for one schema.
type queries struct {
	enqueue, claimAvailable, claimExpired, buryExpired, heartbeat, sameEpoch,
	complete, completeAll, fail, release, releaseInstance, retry, retryable, list, listByKey, stats string
}

func renderQueries(schema string) queries {
	r := func(sql string) string { return pgmigrate.Render(sql, schema) }
	completeAll := fmt.Sprintf(qCompleteAll, pgdb.AssertSQL("count(*) = cardinality($1::bigint[])",
		`'leasequeue: lease lost: ' || count(*) || ' of ' || cardinality($1::bigint[]) || ' claims hold their job'`))
	return queries{
		enqueue:         r(qEnqueue),
		claimAvailable:  r(qClaimAvailable),
		claimExpired:    r(qClaimExpired),
		buryExpired:     r(qBuryExpired),
		heartbeat:       r(qHeartbeat),
		sameEpoch:       r(qSameEpoch),
		complete:        r(qComplete),
		completeAll:     r(completeAll),
		fail:            r(qFail),
		release:         r(qRelease),
		releaseInstance: r(qReleaseInstance),
		retry:           r(qRetry),
		retryable:       r(qRetryable),
		list:            r(qList),
		listByKey:       r(qListByKey),
		stats:           r(qStats),
	}
}

// qEnqueue inserts jobs; an existing (queue, unique_key) makes it a no-op, so
// an idempotent consumer may enqueue the same business work twice safely.
// Enqueue wakes idle workers afterwards, not in this statement (pgnotify).
const qEnqueue = `
WITH ins AS (
    INSERT INTO {schema}.leasequeue_jobs (queue, unique_key, payload, max_attempts, due_at, traceparent, tracestate)
    SELECT $1, u.unique_key, u.payload, u.max_attempts, u.due_at, u.traceparent, u.tracestate
    FROM unnest($2::text[], $3::bytea[], $4::int[], $5::timestamptz[], $6::text[], $7::text[])
        AS u(unique_key, payload, max_attempts, due_at, traceparent, tracestate)
    ON CONFLICT (queue, unique_key) DO NOTHING
    RETURNING id
)
SELECT count(*) FROM ins`

// qClaimAvailable claims fresh jobs. Keyset by id (id > $2) over the partial
// index of available jobs: every claimed row leaves a dead entry at the front
// of that index until vacuum, and a scan from the start walks all of them
// (the "naive" claim of docs/performance.md decays from ~15k to ~3k rows/s).
// The cursor skips them. Its trap, ids committed out of order and retries
// whose due_at was still in the future when the cursor passed, is closed by
// the Worker rewinding the cursor to 0 whenever a claim comes back short and
// at least every FullScanInterval. SKIP LOCKED: concurrent claimers take
// disjoint rows and never wait on each other.
const qClaimAvailable = `
WITH picked AS (
    SELECT id FROM {schema}.leasequeue_jobs
    WHERE queue = $1 AND state = 'available' AND id > $2 AND due_at <= $3
    ORDER BY id
    LIMIT $4
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.leasequeue_jobs j
SET state = 'running', attempts = j.attempts + 1, epoch = j.epoch + 1,
    lease_owner = $5, due_at = $6
FROM picked
WHERE j.id = picked.id
RETURNING j.id, coalesce(j.unique_key, ''), j.payload, j.attempts, j.max_attempts, j.epoch, j.created_at,
          j.traceparent, j.tracestate`

// qClaimExpired claims running jobs whose lease expired (their worker is
// presumed dead): the rescue is an ordinary claim, so it bumps the epoch and
// the previous owner is fenced off from then on. Jobs that used all their
// attempts are left to qBuryExpired.
const qClaimExpired = `
WITH picked AS (
    SELECT id FROM {schema}.leasequeue_jobs
    WHERE queue = $1 AND state = 'running' AND due_at < $2 AND attempts < max_attempts
    ORDER BY due_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.leasequeue_jobs j
SET state = 'running', attempts = j.attempts + 1, epoch = j.epoch + 1,
    lease_owner = $4, due_at = $5
FROM picked
WHERE j.id = picked.id
RETURNING j.id, coalesce(j.unique_key, ''), j.payload, j.attempts, j.max_attempts, j.epoch, j.created_at,
          j.traceparent, j.tracestate`

// qBuryExpired parks jobs whose lease expired on their last attempt: a job
// that keeps killing its worker must not be claimed forever. The epoch bump
// fences off the (presumed dead) owner.
const qBuryExpired = `
UPDATE {schema}.leasequeue_jobs
SET state = 'dead', epoch = epoch + 1, lease_owner = NULL, finished_at = $2,
    last_error = 'lease expired on attempt ' || attempts || ' of ' || max_attempts
        || coalesce(' (previous error: ' || last_error || ')', '')
WHERE id IN (
    SELECT id FROM {schema}.leasequeue_jobs
    WHERE queue = $1 AND state = 'running' AND due_at < $2 AND attempts >= max_attempts
    FOR UPDATE SKIP LOCKED
)
RETURNING id`

// qCompleteAll is qComplete for a completion that expects every claim to
// hold its job, sent in one batch with BEGIN and the effects' first
// statement before its result is known (a pgdb.Tx's queue). It must therefore fail in
// the server when a claim does not hold its job: the error aborts the
// transaction and makes the server skip the effects' statement behind it,
// and the caller starts over with qComplete to learn which claims hold.
// %s is that failure, pgdb.AssertSQL (renderQueries). Two claims of one job in the batch can never both hold: it fails then too.
const qCompleteAll = `
WITH done AS (
    UPDATE {schema}.leasequeue_jobs j
    SET state = 'done', lease_owner = NULL, finished_at = $3
    FROM unnest($1::bigint[], $2::bigint[]) AS c(id, epoch)
    WHERE j.id = c.id AND j.epoch = c.epoch AND j.state = 'running'
    RETURNING j.id
)
SELECT %s FROM done`

// qReleaseInstance gives back, at a worker's start, the jobs a previous
// incarnation of the same instance still holds: that process is dead (this
// one replaced it), so waiting out its leases would only delay the work. The
// epoch bump fences the dead incarnation off exactly as a rescue would; the
// claim's attempt stays charged (the job may be what killed it), and a job
// out of attempts is parked as qBuryExpired parks it. starts_with, not LIKE:
// an instance name may contain '_' or '%'. Running jobs are few; no index.
const qReleaseInstance = `
UPDATE {schema}.leasequeue_jobs
SET state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'available' END,
    finished_at = CASE WHEN attempts >= max_attempts THEN $4::timestamptz END,
    epoch = epoch + 1, due_at = $4, lease_owner = NULL,
    last_error = 'lease held by ' || lease_owner || ' released when instance ' || $2 || ' restarted'
        || coalesce(' (previous error: ' || last_error || ')', '')
WHERE queue = $1 AND state = 'running'
  AND starts_with(lease_owner, $2 || '/') AND lease_owner <> $3
RETURNING id, state, pg_notify($5, '')`

// qRetry requeues parked jobs for an operator, who is audited in the same
// transaction (I6). Only 'dead' jobs: requeueing a running or done job would
// be a second effect. attempts restart so the job gets its full budget again;
// the job then goes through the normal claim and fenced completion.
const qRetry = `
WITH retried AS (
    UPDATE {schema}.leasequeue_jobs
    SET state = 'available', attempts = 0, due_at = $3, finished_at = NULL
    WHERE queue = $1 AND id = ANY($2::bigint[]) AND state = 'dead'
    RETURNING id, last_error
)
INSERT INTO {schema}.leasequeue_job_audit (job_id, action, ticket, actor, from_state, last_error, at)
SELECT id, 'retry', $4, $5, 'dead', last_error, $3 FROM retried
RETURNING job_id`

// qRetryable is qRetry's selection without its effect: the dry run of an
// operator retry.
const qRetryable = `
SELECT id FROM {schema}.leasequeue_jobs
WHERE queue = $1 AND id = ANY($2::bigint[]) AND state = 'dead'
ORDER BY id`

// qList lists jobs for operators, newest first, optionally by state.
const qList = `
SELECT id, coalesce(unique_key, ''), state, attempts, max_attempts, epoch,
       coalesce(lease_owner, ''), due_at, coalesce(last_error, ''), created_at, finished_at
FROM {schema}.leasequeue_jobs
WHERE queue = $1 AND ($2 = '' OR state = $2) AND ($3 = 0 OR id < $3)
ORDER BY id DESC
LIMIT $4`

// qListByKey is qList for one unique key ($5): a probe of the
// (queue, unique_key) unique index. A query of its own: an optional key
// folded into qList as an OR would keep a cached generic plan from using
// that index.
const qListByKey = `
SELECT id, coalesce(unique_key, ''), state, attempts, max_attempts, epoch,
       coalesce(lease_owner, ''), due_at, coalesce(last_error, ''), created_at, finished_at
FROM {schema}.leasequeue_jobs
WHERE queue = $1 AND unique_key = $5 AND ($2 = '' OR state = $2) AND ($3 = 0 OR id < $3)
ORDER BY id DESC
LIMIT $4`

// qStats feeds the gauges (I7): jobs by state, expired leases (a worker died
// or is stuck; rescue should bring this back to zero within RescueInterval)
// and the age of the oldest available job. Each count walks its partial
// index and stops at $3 (statsCountCap): a backlog of millions must not turn
// the monitoring query into a load of its own; beyond the cap the exact
// number changes no alert. Done jobs are not counted (they only grow).
const qStats = `
SELECT
    (SELECT count(*) FROM (SELECT 1 FROM {schema}.leasequeue_jobs WHERE queue = $1 AND state = 'available' LIMIT $3) a),
    (SELECT count(*) FROM (SELECT 1 FROM {schema}.leasequeue_jobs WHERE queue = $1 AND state = 'running' LIMIT $3) r),
    (SELECT count(*) FROM (SELECT 1 FROM {schema}.leasequeue_jobs WHERE queue = $1 AND state = 'running' AND due_at < $2 LIMIT $3) e),
    (SELECT count(*) FROM (SELECT 1 FROM {schema}.leasequeue_jobs WHERE queue = $1 AND state = 'dead' LIMIT $3) d),
    (SELECT min(due_at) FROM {schema}.leasequeue_jobs WHERE queue = $1 AND state = 'available' AND due_at <= $2)`
