package leasequeue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// The lease's story, in the order a job lives it. Every write of a running
// job carries the claim's fencing token, its epoch: the SQL says
// "WHERE id = $id AND epoch = $epoch AND state = 'running'" and the caller
// reads back which (id, epoch) pairs it touched.
//
//  1. Claim (Claim, ClaimExpired): one UPDATE takes due jobs FOR UPDATE SKIP
//     LOCKED and sets state 'running', lease_owner, due_at to the lease's
//     end and epoch to epoch + 1 (qClaimAvailable, qClaimExpired in
//     queries.go). The Job carries that epoch; from now on it is the only
//     thing that tells this claim from a later one of the same job. A
//     rescue of an expired lease, and ReleaseInstance (owner.go), bump it
//     too, which fences the previous owner off.
//  2. Heartbeat: due_at moves on for the (id, epoch) pairs still held; a
//     pair the UPDATE did not match lost its job to another claim, and its
//     handler is cancelled.
//  3. Complete: the fenced done mark and the handler's effects commit in one
//     transaction, or nothing does (completeBatch here; the transaction,
//     whose BEGIN and COMMIT ride the statements' batches, in fencetx.go).
//  4. Fail and Release: the same fence; a claim that lost its job writes
//     nothing and gets ErrLeaseLost.
//
// A worker that stalls past its lease (GC pause, partition) meets a job
// rescued under epoch + 1: its heartbeat, done mark, failure and release all
// match no row.

// Claim takes up to limit available jobs for owner, under a new lease and a
// new fencing token each. cursor is the keyset position (0 scans from the
// start); see qClaimAvailable.
func (q *Queue) Claim(ctx context.Context, owner string, limit int, cursor int64) ([]Job, error) {
	now := q.now()
	jobs, err := q.claim(ctx, q.sql.claimAvailable, owner, q.cfg.Name, cursor, now, limit, owner, now.Add(q.cfg.LeaseDuration))
	if err != nil {
		return nil, err
	}
	q.m.claimed.Add(ctx, int64(len(jobs)), q.m.attrsFresh)
	return jobs, nil
}

// ClaimExpired takes up to limit jobs whose lease expired (their owner is
// presumed dead), and parks the ones that expired on their last attempt.
// Both statements go in one batch (one round trip), i.e. one implicit
// transaction: if either fails neither is applied, and the next rescue
// tries again.
func (q *Queue) ClaimExpired(ctx context.Context, owner string, limit int) ([]Job, error) {
	now := q.now()
	b := &pgx.Batch{}
	b.Queue(q.sql.buryExpired, q.cfg.Name, now)
	b.Queue(q.sql.claimExpired, q.cfg.Name, now, limit, owner, now.Add(q.cfg.LeaseDuration))
	br := q.pool.SendBatch(ctx, b)
	var buried []int64
	var jobs []Job
	rows, err := br.Query()
	if err == nil {
		buried, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err == nil {
		if rows, err = br.Query(); err == nil {
			jobs, err = collectJobs(rows, owner)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("leasequeue: rescue expired leases: %w", err)
	}
	for _, id := range buried {
		q.m.dead.Add(ctx, 1, q.m.attrs)
		q.logger.Error("job parked: lease expired on its last attempt", "job_id", id)
	}
	if len(jobs) > 0 {
		q.m.claimed.Add(ctx, int64(len(jobs)), q.m.attrsRescued)
		for _, j := range jobs {
			q.logger.Warn("rescued job with expired lease", "job_id", j.ID, "epoch", j.Epoch, "attempt", j.Attempt)
		}
	}
	return jobs, nil
}

func (q *Queue) claim(ctx context.Context, sql, owner string, args ...any) ([]Job, error) {
	rows, err := q.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: claim: %w", err)
	}
	jobs, err := collectJobs(rows, owner)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: claim: %w", err)
	}
	return jobs, nil
}

// collectJobs reads the rows of a claim (qClaimAvailable, qClaimExpired).
func collectJobs(rows pgx.Rows, owner string) ([]Job, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Job, error) {
		j := Job{Owner: owner}
		var attempt, maxAttempts int32
		err := r.Scan(&j.ID, &j.UniqueKey, &j.Payload, &attempt, &maxAttempts, &j.Epoch, &j.CreatedAt, &j.Traceparent, &j.Tracestate)
		j.Attempt, j.MaxAttempts = int(attempt), int(maxAttempts)
		return j, err
	})
}

// claim identifies one claim of a job: the fencing unit.
type claim struct{ id, epoch int64 }

func claimOf(j Job) claim { return claim{j.ID, j.Epoch} }

// collectClaims reads the (id, epoch) rows a fenced statement returned.
func collectClaims(rows pgx.Rows) (map[claim]bool, error) {
	held := map[claim]bool{}
	var c claim
	_, err := pgx.ForEachRow(rows, []any{&c.id, &c.epoch}, func() error {
		held[c] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	return held, nil
}

func idsEpochs(jobs []Job) ([]int64, []int64) {
	ids := make([]int64, len(jobs))
	epochs := make([]int64, len(jobs))
	for i, j := range jobs {
		ids[i], epochs[i] = j.ID, j.Epoch
	}
	return ids, epochs
}

// qHeartbeat extends the leases still held by this worker (fenced: a job
// taken over by another worker is not returned, and its handler is told).
const qHeartbeat = `
UPDATE {schema}.leasequeue_jobs j
SET due_at = $3
FROM unnest($1::bigint[], $2::bigint[]) AS h(id, epoch)
WHERE j.id = h.id AND j.epoch = h.epoch AND j.state = 'running'
RETURNING j.id, j.epoch`

// qSameEpoch returns the claims, among those a heartbeat did not extend,
// whose job still carries their epoch: this very claim settled the job (done,
// failed, parked) between the heartbeat's snapshot of in-flight jobs and its
// UPDATE. Only a changed epoch means another claim took the job over.
const qSameEpoch = `
SELECT j.id, j.epoch
FROM unnest($1::bigint[], $2::bigint[]) AS h(id, epoch)
JOIN {schema}.leasequeue_jobs j ON j.id = h.id AND j.epoch = h.epoch`

// Heartbeat extends the leases of jobs still held by their claims and returns
// the claims whose lease was lost (taken over or finished by another claim).
// Their handlers should stop: nothing they write will commit.
func (q *Queue) Heartbeat(ctx context.Context, jobs []Job) (lost []Job, err error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	ids, epochs := idsEpochs(jobs)
	rows, err := q.pool.Query(ctx, q.sql.heartbeat, ids, epochs, q.now().Add(q.cfg.LeaseDuration))
	if err != nil {
		return nil, fmt.Errorf("leasequeue: heartbeat: %w", err)
	}
	held, err := collectClaims(rows)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: heartbeat: %w", err)
	}
	var missed []Job
	for _, j := range jobs {
		if !held[claimOf(j)] {
			missed = append(missed, j)
		}
	}
	if len(missed) == 0 {
		return nil, nil
	}
	// A job this claim settled meanwhile is not lost: only a changed epoch is.
	ids, epochs = idsEpochs(missed)
	rows, err = q.pool.Query(ctx, q.sql.sameEpoch, ids, epochs)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: heartbeat: %w", err)
	}
	settled, err := collectClaims(rows)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: heartbeat: %w", err)
	}
	for _, j := range missed {
		if settled[claimOf(j)] {
			continue
		}
		lost = append(lost, j)
		q.m.leaseLost.Add(ctx, 1, q.m.attrs)
		q.logger.Warn("lease lost: job taken over by another claim; stopping its handler",
			"job_id", j.ID, "epoch", j.Epoch, "owner", j.Owner)
	}
	return lost, nil
}

// qComplete marks jobs done, fenced; the caller runs the jobs' effects in the
// same transaction only for the (id, epoch) pairs returned: one batch may hold
// two claims of one job (a stale one and its successor), and only the current
// epoch's effects may run. The row locks taken here keep any concurrent claim
// away until commit. Its first try, qCompleteAll (queries.go), fails in the
// server unless every claim holds its job.
const qComplete = `
UPDATE {schema}.leasequeue_jobs j
SET state = 'done', lease_owner = NULL, finished_at = $3
FROM unnest($1::bigint[], $2::bigint[]) AS c(id, epoch)
WHERE j.id = c.id AND j.epoch = c.epoch AND j.state = 'running'
RETURNING j.id, j.epoch`

// Complete marks job done and runs effects (may be nil) in the same
// transaction, guarded by the fencing token. It returns ErrLeaseLost, having
// committed nothing, when the claim no longer holds the job.
func (q *Queue) Complete(ctx context.Context, job Job, effects Complete) error {
	res := q.completeBatch(ctx, []completion{{job: job, effects: effects}})
	return res[0]
}

type completion struct {
	job     Job
	effects Complete
}

// completeBatch completes many jobs in one transaction (one commit, one
// fsync, for the whole batch: group commit). Each job is fenced on its own;
// the effects of the jobs still held run in the same transaction. When any
// effect fails, the batch is rolled back and every job is retried alone, so
// one bad job cannot fail the others. It returns one error per completion:
// nil, ErrLeaseLost, or the failure (the job is then failed, fenced).
func (q *Queue) completeBatch(ctx context.Context, cs []completion) []error {
	errs := make([]error, len(cs))
	err := q.completeTx(ctx, cs, errs)
	if err == nil {
		return errs
	}
	if len(cs) == 1 {
		return q.afterSingleFailure(ctx, cs[0], err)
	}
	q.logger.Warn("batch completion failed; completing its jobs one by one", "jobs", len(cs), "error", err)
	for i, c := range cs {
		one := []error{nil}
		if err := q.completeTx(ctx, []completion{c}, one); err != nil {
			errs[i] = q.afterSingleFailure(ctx, c, err)[0]
			continue
		}
		errs[i] = one[0]
	}
	return errs
}

// afterSingleFailure handles a job whose completion transaction failed: an
// effect error fails the attempt (fenced), a commit/connection error leaves
// the job to its lease (the commit may or may not have happened; either way
// the fencing token keeps the outcome single).
func (q *Queue) afterSingleFailure(ctx context.Context, c completion, err error) []error {
	var effErr effectError
	if !errors.As(err, &effErr) {
		q.logger.Error("completion transaction failed; the job is left to its lease",
			"job_id", c.job.ID, "epoch", c.job.Epoch, "error", err)
		return []error{err}
	}
	if ferr := q.Fail(ctx, c.job, effErr.err); ferr != nil && !errors.Is(ferr, ErrLeaseLost) {
		q.logger.Error("recording a failed completion failed; the job is left to its lease",
			"job_id", c.job.ID, "error", ferr)
	}
	return []error{effErr.err}
}

type effectError struct{ err error }

func (e effectError) Error() string { return "job effects: " + e.err.Error() }
func (e effectError) Unwrap() error { return e.err }

// qFail records failed attempts, fenced: retry after a backoff, or park
// ('dead') when permanent or out of attempts.
const qFail = `
UPDATE {schema}.leasequeue_jobs j
SET state = CASE WHEN f.dead THEN 'dead' ELSE 'available' END,
    due_at = f.due_at, last_error = f.err, lease_owner = NULL,
    finished_at = CASE WHEN f.dead THEN $6::timestamptz END
FROM unnest($1::bigint[], $2::bigint[], $3::bool[], $4::timestamptz[], $5::text[])
    AS f(id, epoch, dead, due_at, err)
WHERE j.id = f.id AND j.epoch = f.epoch AND j.state = 'running'
RETURNING j.id, j.epoch`

// Fail records a failed attempt of job (fenced): retried after a backoff, or
// parked when cause is marked permanent (retry.Permanent) or the attempts are
// exhausted. It returns
// ErrLeaseLost when the claim no longer holds the job.
func (q *Queue) Fail(ctx context.Context, job Job, cause error) error {
	res, err := q.fail(ctx, q.pool, []failure{{job: job, cause: cause}})
	if err != nil {
		return err
	}
	q.countFailures(ctx, res)
	return res[0].err
}

type failure struct {
	job   Job
	cause error
}

type failResult struct {
	dead bool
	err  error // ErrLeaseLost when fenced off
}

// fail records failures through db (fenced) and reports, per failure,
// whether the job was parked or the claim had lost it. It is one statement,
// its own transaction on a pool: no BEGIN and COMMIT of their own.
func (q *Queue) fail(ctx context.Context, db pgdb.Executor, fs []failure) ([]failResult, error) {
	n := len(fs)
	ids, epochs := make([]int64, n), make([]int64, n)
	dead, dues, msgs := make([]bool, n), make([]time.Time, n), make([]string, n)
	now := q.now()
	for i, f := range fs {
		ids[i], epochs[i] = f.job.ID, f.job.Epoch
		dead[i] = retry.IsPermanent(f.cause) || f.job.Attempt >= f.job.MaxAttempts
		dues[i] = now.Add(q.cfg.Backoff.Delay(f.job.Attempt))
		msgs[i] = truncate(fmt.Sprintf("attempt %d: %v", f.job.Attempt, f.cause), 2000)
	}
	rows, err := db.Query(ctx, q.sql.fail, ids, epochs, dead, dues, msgs, now)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: fail: %w", err)
	}
	isHeld, err := collectClaims(rows)
	if err != nil {
		return nil, fmt.Errorf("leasequeue: fail: %w", err)
	}
	res := make([]failResult, n)
	for i, f := range fs {
		if !isHeld[claimOf(f.job)] {
			res[i].err = ErrLeaseLost
			continue
		}
		res[i].dead = dead[i]
		if dead[i] {
			q.logger.Error("job parked", "job_id", f.job.ID, "attempt", f.job.Attempt,
				"max_attempts", f.job.MaxAttempts, "permanent", retry.IsPermanent(f.cause), "error", f.cause)
		} else {
			q.logger.Warn("job attempt failed; will retry", "job_id", f.job.ID, "attempt", f.job.Attempt,
				"retry_at", dues[i], "error", f.cause)
		}
	}
	return res, nil
}

// qRelease gives claimed jobs back on graceful shutdown: claimable at once,
// and the claim's attempt returned (a deploy is not the job's fault).
const qRelease = `
UPDATE {schema}.leasequeue_jobs j
SET state = 'available', attempts = j.attempts - 1, due_at = $3, lease_owner = NULL
FROM unnest($1::bigint[], $2::bigint[]) AS r(id, epoch)
WHERE j.id = r.id AND j.epoch = r.epoch AND j.state = 'running'
RETURNING j.id`

// Release gives jobs back (graceful shutdown): claimable at once, attempt
// returned. Jobs no longer held are ignored.
func (q *Queue) Release(ctx context.Context, jobs []Job) (int, error) {
	if len(jobs) == 0 {
		return 0, nil
	}
	ids, epochs := idsEpochs(jobs)
	tag, err := q.pool.Exec(ctx, q.sql.release, ids, epochs, q.now())
	if err != nil {
		return 0, fmt.Errorf("leasequeue: release: %w", err)
	}
	q.m.released.Add(ctx, tag.RowsAffected(), q.m.attrs)
	return int(tag.RowsAffected()), nil
}
