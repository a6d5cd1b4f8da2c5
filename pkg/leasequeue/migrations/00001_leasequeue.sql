-- +goose Up
-- Leased job queue (pkg/leasequeue). One row per job, whatever its state.
-- The tables carry the package's name: a service database shares the schema
-- with the service's own tables, and "jobs" is the first name a service
-- would pick for its own.
CREATE TABLE {schema}.leasequeue_jobs (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Several queues share the table, separated by name.
    queue        text        NOT NULL,
    -- Business identity of the job: at most one job per (queue, unique_key),
    -- ever (e.g. one invoice job per work order, even when two distinct events
    -- announce the same completion).
    unique_key   text,
    payload      bytea       NOT NULL,
    state        text        NOT NULL DEFAULT 'available'
        CHECK (state IN ('available', 'running', 'done', 'dead')),
    -- Claims so far, including the running one. A release on graceful
    -- shutdown gives its claim back.
    attempts     integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts integer     NOT NULL CHECK (max_attempts > 0),
    -- When the job next needs attention. available: not before (backoff);
    -- running: the lease expiry, after which any worker may claim it.
    due_at       timestamptz NOT NULL,
    -- Fencing token: +1 at every claim. Every write of a running job checks
    -- it, so a worker whose lease was taken over cannot write.
    epoch        bigint      NOT NULL DEFAULT 0,
    lease_owner  text,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    -- W3C trace context of the span that enqueued the job: each attempt's
    -- span links to it, so the job's trace is reachable from the event that
    -- caused it. Empty when tracing was off.
    traceparent  text        NOT NULL DEFAULT '',
    tracestate   text        NOT NULL DEFAULT '',
    CONSTRAINT leasequeue_jobs_queue_unique_key UNIQUE (queue, unique_key),
    CONSTRAINT leasequeue_jobs_running_has_owner CHECK (state <> 'running' OR lease_owner IS NOT NULL)
);
-- Claim of fresh work: keyset by id over available jobs only (see the claim
-- query in pkg/leasequeue for why by id).
CREATE INDEX leasequeue_jobs_available_idx ON {schema}.leasequeue_jobs (queue, id) WHERE state = 'available';
-- Rescue of expired leases: running jobs by lease expiry.
CREATE INDEX leasequeue_jobs_running_idx ON {schema}.leasequeue_jobs (queue, due_at) WHERE state = 'running';
-- Operators list parked jobs; the dead-count gauge counts them.
CREATE INDEX leasequeue_jobs_dead_idx ON {schema}.leasequeue_jobs (queue, id) WHERE state = 'dead';

-- Every privileged repair of a job (Queue.Retry): who, under which ticket, what.
CREATE TABLE {schema}.leasequeue_job_audit (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL REFERENCES {schema}.leasequeue_jobs (id),
    action     text        NOT NULL,
    ticket     text        NOT NULL CHECK (length(btrim(ticket)) BETWEEN 1 AND 200),
    actor      text        NOT NULL CHECK (length(btrim(actor)) BETWEEN 1 AND 200),
    from_state text        NOT NULL,
    last_error text,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX leasequeue_job_audit_job_idx ON {schema}.leasequeue_job_audit (job_id, id);

-- +goose Down
DROP TABLE {schema}.leasequeue_job_audit;
DROP TABLE {schema}.leasequeue_jobs;
