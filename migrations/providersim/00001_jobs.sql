-- +goose Up

-- jobs: one row per accepted work order. The provider simulator's own store;
-- nothing outside services/provider-sim reads it.
CREATE TABLE jobs (
    job_id         uuid        PRIMARY KEY,
    -- The caller's work order id is the idempotency key of SubmitWorkOrder.
    work_order_id  uuid        NOT NULL CONSTRAINT jobs_work_order_id_key UNIQUE,
    customer_id    text        NOT NULL,
    description    text        NOT NULL,
    positions      integer     NOT NULL CHECK (positions BETWEEN 1 AND 100000),
    -- ACCEPTED -> EXECUTING (started event recorded) -> COMPLETED (completion
    -- events recorded, maybe not yet all published) -> DONE (all published).
    status         text        NOT NULL DEFAULT 'ACCEPTED'
                               CHECK (status IN ('ACCEPTED', 'EXECUTING', 'COMPLETED', 'DONE')),
    -- Execution time drawn at acceptance (base + positions x cost, jittered,
    -- plus extra delay), so a restart resumes the same schedule.
    run_for_us     bigint      NOT NULL CHECK (run_for_us >= 0),
    accepted_at    timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    completed_at   timestamptz,

    -- The fault plan drawn at acceptance: durable, so a restart replays the
    -- same faults instead of drawing new ones.
    fault_early_completion boolean NOT NULL DEFAULT false,
    fault_duplicate        boolean NOT NULL DEFAULT false,
    -- Items in the first tranche of a split completion; 0 = not split.
    fault_split_first      integer NOT NULL DEFAULT 0,
    fault_poison           text    NOT NULL DEFAULT ''
                                   CHECK (fault_poison IN ('', 'unparseable', 'missing_work_order_id', 'negative_items')),
    fault_unknown_order    boolean NOT NULL DEFAULT false,
    -- Cleared, in its own commit, just before the publish that crashes: the
    -- restarted process must republish, not crash again.
    fault_crash_pending    boolean NOT NULL DEFAULT false,

    -- Lease: a worker owns a job while lease_until is in the future. Every write
    -- of the owner checks lease_token (fencing), so a worker that lost its lease
    -- cannot overwrite the new owner's progress.
    lease_owner    text,
    lease_until    timestamptz,
    lease_token    bigint      NOT NULL DEFAULT 0,
    -- Technical failures (Pub/Sub unavailable) retry after not_before.
    not_before     timestamptz NOT NULL DEFAULT now(),
    attempts       integer     NOT NULL DEFAULT 0,
    last_error     text,
    -- W3C trace context of the SubmitWorkOrder call: the execution's span
    -- links to it (docs/adr/0009). Empty when the caller was not traced.
    traceparent    text        NOT NULL DEFAULT '',
    tracestate     text        NOT NULL DEFAULT '',
    CONSTRAINT jobs_split_within_positions CHECK (fault_split_first >= 0 AND fault_split_first < positions)
);

-- The claim scans only unfinished jobs; DONE rows (the vast majority) stay out
-- of the index, so the claim cost does not grow with history.
CREATE INDEX jobs_unfinished ON jobs (not_before) WHERE status <> 'DONE';

-- job_events: every message the simulator publishes, recorded BEFORE it is
-- published. event_id is therefore stable across re-publishing (after a crash,
-- a lost lease or a restart): consumers deduplicate on it.
CREATE TABLE job_events (
    event_id       uuid        PRIMARY KEY,
    job_id         uuid        NOT NULL REFERENCES jobs (job_id),
    -- Publication order within the job.
    seq            integer     NOT NULL,
    kind           text        NOT NULL CHECK (kind IN ('STARTED', 'COMPLETED', 'POISON', 'UNKNOWN_ORDER')),
    event_type     text        NOT NULL,
    ordering_key   text        NOT NULL,
    -- Exact bytes published; re-publishing sends the same bytes.
    payload        bytea       NOT NULL,
    -- 2 when the duplicate fault publishes the message twice in a row (F4).
    copies         integer     NOT NULL DEFAULT 1 CHECK (copies IN (1, 2)),
    occurred_at    timestamptz NOT NULL,
    published_at   timestamptz,
    -- Messages sent for this row, counting every re-publish.
    publish_count  integer     NOT NULL DEFAULT 0,
    CONSTRAINT job_events_job_seq_key UNIQUE (job_id, seq)
);

-- +goose Down
DROP TABLE job_events;
DROP TABLE jobs;
