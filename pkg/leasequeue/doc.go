// Package leasequeue is a PostgreSQL job queue whose jobs are held under a
// lease with a fencing token, so that each job has exactly one effect across
// crashes, stalls, lease expiries and any number of worker replicas.
//
// Lesson: a lease alone cannot stop a worker that was paused past its lease
// from writing after its successor; a fencing token checked by every write
// can, and committing the effect in the fenced "done" transaction turns
// "at least once" work into exactly one effect. Guards F12 (a dead worker's
// jobs are redone after the lease), F13 (a stale worker's completion is
// fenced off) and the invariants I3 (one invoice per work order, with the
// unique keys), I6 (audited retry of dead jobs) and I7 (the dead and
// expired-lease gauges).
//
// Next hop: pkg/outbox; the issuer's Complete closure appends InvoiceIssued,
// which pkg/outboxpubsub publishes back to the work order's pkg/consumer.
//
// # Reading the code
//
// Start with lease.go: claim, heartbeat, fenced completion, failure and
// release, each beside the statement it runs, so that the epoch every write
// checks stays in sight. Beside it:
//
//   - fencetx.go: the completion's transaction (BEGIN with the fenced done
//     mark, COMMIT with the wake-ups);
//   - worker.go: the Worker's loops (fetch, heartbeat, group-committed
//     completion);
//   - queue.go: Queue, New and its options, Enqueue; config.go: Config and
//     WorkerConfig;
//   - owner.go: lease owners and ReleaseInstance; job.go: Job, Handler,
//     Complete; queries.go: the claims' and the operators' SQL;
//   - ops.go: the operator operations; metrics.go: the instruments.
//
// # Guarantees
//
// A job is claimed in batches with FOR UPDATE SKIP LOCKED. The claim writes an
// owner, a lease expiry (due_at) and a fencing token (epoch, +1 at every
// claim). While the handler runs, a heartbeat extends the lease, so a job may
// run for as long as its worker is alive. A job whose lease expired is
// claimable again by any worker (the rescue), which bumps the epoch.
//
// Every write of a running job is fenced: it matches id AND epoch AND
// state = 'running' and checks the rows it affected. A state check alone is
// not enough: a worker whose lease expired and was taken over sees the same
// state ('running') as the new owner; only the token tells them apart. A
// fenced-off write commits nothing and returns ErrLeaseLost.
//
// Exactly one effect: a Handler does its work outside any transaction and
// returns a Complete closure; the queue runs that closure inside the
// transaction that performs the fenced "done" update, only if the claim still
// holds the job. The effects therefore commit if and only if the job is marked
// done by its current owner. The handler's work outside the transaction may
// run more than once (a stalled worker and its successor): it must have no
// external effect of its own. A message to another system leaves through a
// transactional outbox written by the closure.
//
// Failures: an error retries the job after Config.Backoff; an error marked
// with retry.Permanent, or the last attempt, parks it (state 'dead') with its
// last error for an operator. A job whose lease expires on its last attempt
// is parked too, so a job that kills its worker cannot loop forever. On
// graceful shutdown, unfinished jobs are released (claimable at once, attempt
// given back).
//
// # Tables
//
// {schema}.leasequeue_jobs holds one row per job in any state
// (available → running → done; running → available or dead; dead → available
// only through Queue.Retry), several queues in one table separated by
// leasequeue_jobs.queue; at most one job per (queue, unique_key), ever.
// {schema}.leasequeue_job_audit records every operator repair (who, under
// which ticket, from which state). A service's own tables may reference
// leasequeue_jobs(id) (e.g. an invoice recording the job that issued it); the
// package's tables never reference a service's.
//
// # Applying the schema
//
// The package ships its migrations (migrations/*.sql, goose format, with the
// placeholder {schema}). Apply them before the service's own:
//
//	pgmigrate.Apply(ctx, db, leasequeue.Migrations("jobs"), serviceSet)
//
// Their versions are tracked in
// {schema}.leasequeue_schema_version. The schema defaults to DefaultSchema
// ("public"); to keep the tables elsewhere, or to run two copies of the
// package in one database, pass the same name to Migrations and, through
// WithSchema, to New (a Worker works in its Queue's schema). Every query is
// qualified with it. The schema is an Option, not a Config field: it is
// wiring that must match the migrations the service applied, not a tunable
// read from the environment.
//
// # Configuration
//
// Config (one per queue: name, lease, backoff, stats interval) and
// WorkerConfig (concurrency, polling, rescue, heartbeat, completion batching,
// shutdown grace, instance identity) document each field with its default and
// the reason for it. WorkerConfig.ValidateFor checks a worker's configuration
// against its queue's (the heartbeat must be shorter than the lease).
//
// # Layers
//
// Queue holds the fenced primitives (Enqueue, Claim, ClaimExpired, Heartbeat,
// Complete, Fail, Release, ReleaseInstance) and the operator operations
// (List, Retry, Stats). Worker runs the loops over a Queue: fetch (keyset
// claim and rescue), heartbeat, and group-committed completion (many jobs per
// transaction, each fenced on its own). Run any number of Workers in any
// number of processes. Enqueue takes the caller's transaction, so a job exists
// if and only if the business write that caused it commits.
//
// # Metrics
//
// Counters, attribute queue: leasequeue.jobs.enqueued, leasequeue.jobs.claimed
// (source available or expired_lease), leasequeue.jobs.completed,
// leasequeue.jobs.retried, leasequeue.jobs.dead (alert on any),
// leasequeue.jobs.released, leasequeue.lease.fenced (a stale owner tried to
// write; a steady rate means the lease is too short) and
// leasequeue.lease.lost. Gauges refreshed by Queue.RunStats (run it once per
// process): leasequeue.jobs (by state, capped counts),
// leasequeue.leases.expired (alert when above zero for longer than the rescue
// interval) and leasequeue.jobs.oldest_available_age.
//
// # Operator operations
//
// Queue.List lists jobs (by state, newest first). Queue.Retry requeues parked
// jobs with a fresh attempt budget, requires a ticket and an actor, and writes
// one leasequeue_job_audit row per job in the same transaction; the jobs then
// take the normal claim and fenced completion. Never update leasequeue_jobs by
// hand: a manual state change bypasses the fencing token and can produce a
// second effect.
//
// See docs/adr/0006-leases-heartbeat-fencing.md for the design and the
// alternatives rejected.
package leasequeue
