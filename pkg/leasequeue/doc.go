// Package leasequeue is a PostgreSQL job queue whose jobs are held under a
// lease with a fencing token, so that "exactly one effect per job" holds
// across crashes, lease expiries and any number of worker replicas.
//
// A job is claimed in batches with FOR UPDATE SKIP LOCKED. The claim writes
// an owner, a lease expiry (jobs.due_at) and a fencing token (jobs.epoch, +1
// at every claim). While the handler runs, a heartbeat extends the lease, so
// a job may run for as long as its worker is alive (River's rescuer, without
// a heartbeat, caps how long a job may run: riverqueue/river#682). A job
// whose lease expired is claimable again by any worker.
//
// Every write of a running job is fenced: it matches id AND epoch AND
// state = 'running' and checks the rows it affected. A state check alone is
// not enough: a worker whose lease expired and was taken over sees the same
// state ('running') as the new owner; only the token tells them apart
// (riverqueue/river#1302 and #1373: the rescuer overwrote a completed job).
// Completion runs the caller's effects in the transaction that performs the
// fenced update, so a fenced-off worker commits nothing (Queue.Complete,
// Handler's Complete closure). See docs/adr/0006-leases-heartbeat-fencing.md.
//
// Schema: the tables jobs and job_audit, created by each service's migration
// (the reference DDL is migrations/billing/00001_billing.sql, "Leased job
// queue"). Several queues share one table, separated by jobs.queue.
//
// Layers: Queue holds the fenced primitives (Enqueue, Claim, Heartbeat,
// Complete, Fail, Release) and the operator operations (List, Retry, Stats);
// Worker runs the loops (fetch, heartbeat, rescue, complete) over a Queue.
package leasequeue
