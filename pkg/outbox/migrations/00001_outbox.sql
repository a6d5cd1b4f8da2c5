-- +goose Up
-- Transactional outbox (ADR 0001, ADR 0002). A business transaction inserts
-- its events into {schema}.outbox (outbox.Append); relays claim them with the
-- locks of one transaction held across the dispatch, and publish an event by
-- moving it to {schema}.outbox_published.
--
-- Status machine of an event (the CHECKs below; outbox_events shows all):
--   outbox             PENDING  --claimed--> locked by a relay's transaction
--                                            (the in-flight "PUBLISHING" state:
--                                            pg_locks, never written; released
--                                            at once when the relay dies)
--                      locked   --dispatched--> moved to outbox_published
--                      locked   --transient-->  PENDING, next_attempt_at = now + backoff
--                      locked   --permanent, unknown type, attempts exhausted--> FAILED
--   outbox_published   PUBLISHED, deleted after the retention
-- Event types in slow mode (WithSlowDispatch) are claimed by a committed
-- lease instead of a held lock: PENDING with lease_owner/lease_until set is
-- their in-flight state, settled by one short transaction per event.
-- FAILED keeps blocking later events of its aggregate until an operator
-- requeues it (docs/runbooks/outbox-relay-stalled.md).

CREATE TABLE {schema}.outbox (
    -- The message id downstream: the key every consumer deduplicates on.
    event_id         uuid        PRIMARY KEY,
    -- Claim order. Assigned at insert, so transactions can commit out of id
    -- order: the relay's keyset cursor is always paired with a sweep and a
    -- rewind on NOTIFY (see pkg/outbox/queries.go).
    id               bigint      GENERATED ALWAYS AS IDENTITY,
    aggregate_type   text        NOT NULL CHECK (aggregate_type <> ''),
    -- Ordering key: events of one aggregate dispatch in id order.
    aggregate_id     text        NOT NULL CHECK (aggregate_id <> ''),
    -- Full proto name of the payload message; selects the dispatcher.
    event_type       text        NOT NULL CHECK (event_type <> ''),
    schema_version   integer     NOT NULL DEFAULT 1 CHECK (schema_version >= 1),
    -- Protobuf binary, forwarded unchanged.
    payload          bytea       NOT NULL,
    -- correlation_id, traceparent, tracestate.
    headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status           text        NOT NULL DEFAULT 'PENDING'
        CONSTRAINT outbox_status_valid CHECK (status IN ('PENDING', 'FAILED')),
    -- Failed dispatch attempts so far, written when a failure is recorded.
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error       text,
    -- Earliest time a PENDING row may be claimed again after a transient
    -- failure (backoff); NULL: no backoff pending, claim at once.
    next_attempt_at  timestamptz,
    -- The lease of an event type dispatched in slow mode (WithSlowDispatch;
    -- lease.go): the claim token of the relay dispatching it outside any
    -- transaction, and when that claim expires. NULL on rows no relay
    -- leased, and cleared when the outcome is recorded. A lease found
    -- expired means its relay died or overran it mid-dispatch; if the event
    -- was dispatched alone (nothing else in flight in that process), the
    -- death is its doing and it is charged an attempt. Types in lock mode
    -- never set them.
    lease_owner      text,
    lease_until      timestamptz,
    lease_alone      boolean     NOT NULL DEFAULT false,
    -- Business time of the fact, set by the producer...
    occurred_at      timestamptz NOT NULL,
    -- ...distinct from the time the row was written (basis of the age alarm).
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- The claim index: PENDING rows in claim order. Published rows leave the
-- table, so it holds the backlog only; FAILED rows are out of it.
CREATE INDEX outbox_pending_idx ON {schema}.outbox (id) WHERE status = 'PENDING';

-- The per-aggregate ordering guard: "is there an earlier row of this
-- aggregate still in the outbox?" is one probe of this index.
CREATE INDEX outbox_aggregate_idx ON {schema}.outbox (aggregate_id, id);

-- Leases in flight (slow mode), for the probe for expired ones: only leased
-- rows have an entry, so it stays as small as the dispatches in flight and
-- the lock claim's rows never touch it.
CREATE INDEX outbox_lease_idx ON {schema}.outbox (lease_until) WHERE lease_until IS NOT NULL;

-- The outbox is a queue table: every row is inserted and soon deleted, and
-- its dead version costs the claim's index walk and the ordering probe until
-- vacuum removes it. After a long transaction ends (it held vacuum back), the
-- first vacuum has every row published meanwhile to remove; at the default
-- cost delay (2 ms per 200 cost units) it crawls, and the relay runs slowly
-- all that time. Unthrottled, it is over sooner: in B2 at the design's length
-- (10M backlog, 60 s hold) the relay's rate in the last 30 s of the minute
-- after the release went from 13.7k to 25.8k rows/s (ADR 0002). The price is
-- a burst of I/O on this one table's vacuum.
ALTER TABLE {schema}.outbox SET (autovacuum_vacuum_cost_delay = 0);

-- Wakes the relays (LISTEN) when events commit: one notification per INSERT
-- statement, delivered at commit (never for a rolled-back one). The payload
-- is the lowest id inserted, so a relay whose cursor has already passed it (a
-- transaction that committed out of id order) rewinds at once. The channel
-- is named after the schema ("public.outbox"): outboxes in two schemas of one
-- database must not wake each other's relays.
-- +goose StatementBegin
CREATE FUNCTION {schema}.outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{schema}.outbox', (SELECT min(id)::text FROM inserted));
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_notify AFTER INSERT ON {schema}.outbox
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.outbox_notify();

CREATE TABLE {schema}.outbox_published (
    -- A row moves here once: the key turns a second move into an error.
    event_id        uuid        PRIMARY KEY,
    id              bigint      NOT NULL,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    event_type      text        NOT NULL,
    schema_version  integer     NOT NULL,
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL,
    -- Dispatch attempts, the successful one included.
    attempts        integer     NOT NULL CHECK (attempts >= 1),
    -- The error of the last failed attempt, if any (diagnosis).
    last_error      text,
    occurred_at     timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    published_at    timestamptz NOT NULL
);

-- Retention cleanup finds rows older than the retention. BRIN: rows arrive
-- in published_at order, so page ranges summarise well and the index costs
-- almost nothing on the insert.
CREATE INDEX outbox_published_brin ON {schema}.outbox_published USING brin (published_at) WITH (autosummarize = on);

-- Every event, delivered or not, with its status: what operators and tests
-- read. A row is in exactly one of the two tables in any snapshot, because
-- the move is one statement.
CREATE VIEW {schema}.outbox_events AS
SELECT event_id, id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers,
       status, attempts, last_error, next_attempt_at, occurred_at, created_at,
       NULL::timestamptz AS published_at
FROM {schema}.outbox
UNION ALL
SELECT event_id, id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers,
       'PUBLISHED', attempts, last_error, NULL, occurred_at, created_at, published_at
FROM {schema}.outbox_published;

-- The dispatch journal: how the relay charges an attempt to an event whose
-- dispatch kills the relay process (ADR 0002, "A poison event that crashes
-- the relay process"). A crash rolls the claim transaction back, so nothing
-- in outbox records the attempt; a row here, committed on its own before the
-- dispatch, survives it.
--
--   before dispatching a claimed batch      INSERT (ids, exclusive = false), own commit
--   before dispatching each suspect alone   INSERT, then UPDATE, ids = {that id},
--                                           exclusive = true, own commit
--   settling the batch                      DELETE, in the claim transaction
--
-- A row whose events a later claim holds was left by a relay that died (or
-- rolled back) mid-batch. Its events become suspects, dispatched one at a
-- time with nothing else in flight in that process; an exclusive row left
-- behind names the event whose dispatch died, and the next claim charges it
-- an attempt (FAILED at the relay's MaxAttempts).
--
-- UNLOGGED: the journal costs no WAL and no fsync on the relay's hot path. A
-- database crash empties it, which forgets at most one crash per event in
-- flight; a crash loop is charged from the next crash on.
CREATE UNLOGGED TABLE {schema}.outbox_dispatching (
    batch_id   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- outbox.id of the events dispatched.
    ids        bigint[]    NOT NULL,
    -- One event, dispatched with nothing else in flight in its process: a
    -- crash can be charged to it.
    exclusive  boolean     NOT NULL,
    relay_id   text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE {schema}.outbox_dispatching;
DROP VIEW {schema}.outbox_events;
DROP TABLE {schema}.outbox_published;
DROP TRIGGER outbox_notify ON {schema}.outbox;
DROP FUNCTION {schema}.outbox_notify();
DROP TABLE {schema}.outbox;
