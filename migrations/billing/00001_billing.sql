-- +goose Up
-- Billing's own database. Three groups of tables:
--   1. intake:  processed_events (pkg/dedup) and parked_messages;
--   2. jobs:    jobs + job_audit (pkg/leasequeue), the leased invoice work;
--   3. ledger:  invoices + invoice_lines.
-- The outbox (00002, pkg/outbox) lives here too, so that an invoice and its
-- InvoiceIssued event commit in one local transaction.

-- Idempotent-consumer markers (pkg/dedup). The primary key is where the
-- correctness lives: the marker is inserted first, in the same transaction as
-- the effect, and a second delivery of the same event finds the key taken.
-- consumer scopes the marker: two consumers may legitimately process one event.
CREATE TABLE processed_events (
    consumer     text        NOT NULL CHECK (length(consumer) BETWEEN 1 AND 100),
    event_id     text        NOT NULL CHECK (length(event_id) BETWEEN 1 AND 200),
    event_type   text        NOT NULL,
    -- SHA-256 of the payload: the same id with other content is a producer
    -- bug, reported, not silently treated as a duplicate.
    fingerprint  bytea       NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
-- Batched retention cleanup walks the oldest markers first.
CREATE INDEX processed_events_processed_at_idx ON processed_events (processed_at);

-- Messages the consumer could not turn into work: unparseable, wrong schema,
-- invalid content. Kept with their raw bytes and the reason, then acked: a
-- poison message is never lost and never retried forever (F9).
CREATE TABLE parked_messages (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription text        NOT NULL,
    message_id   text        NOT NULL,
    event_id     text,
    event_type   text,
    attributes   jsonb       NOT NULL DEFAULT '{}',
    data         bytea       NOT NULL,
    reason       text        NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    -- A redelivered poison message is parked once.
    UNIQUE (subscription, message_id)
);

-- Leased job queue (pkg/leasequeue). One row per job, whatever its state.
CREATE TABLE jobs (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text        NOT NULL,
    -- Business identity of the job: at most one job per (queue, unique_key),
    -- ever. Billing uses the work order id: one invoice job per order even when
    -- two distinct events announce the same completion.
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
    -- it, so a worker whose lease was taken over cannot write (F13).
    epoch        bigint      NOT NULL DEFAULT 0,
    lease_owner  text,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    -- W3C trace context of the span that enqueued the job: each attempt's
    -- span links to it, so the job's trace is reachable from the event that
    -- caused it (docs/adr/0009). Empty when tracing was off.
    traceparent  text        NOT NULL DEFAULT '',
    tracestate   text        NOT NULL DEFAULT '',
    CONSTRAINT jobs_queue_unique_key UNIQUE (queue, unique_key),
    CONSTRAINT jobs_running_has_owner CHECK (state <> 'running' OR lease_owner IS NOT NULL)
);
-- Claim of fresh work: keyset by id over available jobs only (see the claim
-- query in pkg/leasequeue for why by id).
CREATE INDEX jobs_available_idx ON jobs (queue, id) WHERE state = 'available';
-- Rescue of expired leases: running jobs by lease expiry.
CREATE INDEX jobs_running_idx ON jobs (queue, due_at) WHERE state = 'running';
-- Operators list parked jobs; the dead-count gauge counts them.
CREATE INDEX jobs_dead_idx ON jobs (queue, id) WHERE state = 'dead';

-- Every privileged repair of a job (I6): who, under which ticket, what.
CREATE TABLE job_audit (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL REFERENCES jobs (id),
    action     text        NOT NULL,
    ticket     text        NOT NULL CHECK (length(btrim(ticket)) BETWEEN 1 AND 200),
    actor      text        NOT NULL CHECK (length(btrim(actor)) BETWEEN 1 AND 200),
    from_state text        NOT NULL,
    last_error text,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_audit_job_idx ON job_audit (job_id, id);

-- Invoice numbers are unique and human readable, not gapless: a rolled back
-- issue consumes a number. Jurisdictions that require gapless numbering need
-- a locked counter row instead (one writer at a time).
CREATE SEQUENCE invoice_number_seq;

CREATE TABLE invoices (
    id            uuid        PRIMARY KEY,
    number        text        NOT NULL UNIQUE,
    -- I3: exactly one invoice per work order, enforced by the database.
    work_order_id uuid        NOT NULL UNIQUE,
    customer_id   text        NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 64),
    currency_code text        NOT NULL CHECK (currency_code ~ '^[A-Z]{3}$'),
    total_minor   bigint      NOT NULL CHECK (total_minor >= 0),
    issued_at     timestamptz NOT NULL,
    -- The job and the event that produced the invoice, for reconciliation.
    job_id        bigint      NOT NULL REFERENCES jobs (id),
    source_event  text        NOT NULL
);
-- ListInvoices: keyset pages newest first.
CREATE INDEX invoices_issued_idx ON invoices (issued_at DESC, id DESC);

CREATE TABLE invoice_lines (
    invoice_id       uuid    NOT NULL REFERENCES invoices (id),
    line_no          integer NOT NULL CHECK (line_no >= 1),
    description      text    NOT NULL,
    quantity         integer NOT NULL CHECK (quantity >= 0),
    unit_price_minor bigint  NOT NULL CHECK (unit_price_minor >= 0),
    amount_minor     bigint  NOT NULL CHECK (amount_minor >= 0),
    PRIMARY KEY (invoice_id, line_no)
);

-- +goose Down
DROP TABLE invoice_lines;
DROP TABLE invoices;
DROP SEQUENCE invoice_number_seq;
DROP TABLE job_audit;
DROP TABLE jobs;
DROP TABLE parked_messages;
DROP TABLE processed_events;
