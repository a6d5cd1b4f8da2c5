-- +goose Up
-- The outbox relay claims rows with the locks of one transaction that it
-- holds across the dispatch, and publishes a row by moving it to
-- outbox_published (ADR 0002, "Revision 2"). The outbox table keeps only the
-- events still to deliver; the same file changes the billing outbox.
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
-- FAILED keeps blocking later events of its aggregate until an operator
-- requeues it (docs/runbooks/outbox-relay-stalled.md).
--
-- Run with the relays stopped: a row an old relay had leased (PUBLISHING)
-- goes back to PENDING and may be dispatched once more (at-least-once).

CREATE TABLE outbox_published (
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
CREATE INDEX outbox_published_brin ON outbox_published USING brin (published_at) WITH (autosummarize = on);

INSERT INTO outbox_published (event_id, id, aggregate_type, aggregate_id, event_type, schema_version,
                              payload, headers, attempts, last_error, occurred_at, created_at, published_at)
SELECT event_id, id, aggregate_type, aggregate_id, event_type, schema_version,
       payload, headers, greatest(attempts, 1), last_error, occurred_at, created_at, published_at
FROM outbox WHERE status = 'PUBLISHED';
DELETE FROM outbox WHERE status = 'PUBLISHED';

ALTER TABLE outbox
    DROP CONSTRAINT outbox_lease_consistent,
    DROP CONSTRAINT outbox_published_consistent,
    DROP CONSTRAINT outbox_status_valid;
UPDATE outbox SET status = 'PENDING' WHERE status = 'PUBLISHING';
DROP INDEX outbox_unpublished_idx;
DROP INDEX outbox_aggregate_unpublished_idx;
DROP INDEX outbox_published_at_brin;
ALTER TABLE outbox
    DROP COLUMN lease_owner,
    DROP COLUMN lease_expires_at,
    DROP COLUMN published_at,
    ADD CONSTRAINT outbox_status_valid CHECK (status IN ('PENDING', 'FAILED')),
    -- Rows are inserted and deleted; the only update (a retry) is rare, so
    -- the free room kept for in-place claims is no longer worth its pages.
    RESET (fillfactor);
COMMENT ON COLUMN outbox.attempts IS
    'Failed dispatch attempts so far, written when a failure is recorded.';

-- The claim index: PENDING rows in claim order. Published rows leave the
-- table, so it holds the backlog only; FAILED rows are out of it.
CREATE INDEX outbox_pending_idx ON outbox (id) WHERE status = 'PENDING';

-- The per-aggregate ordering guard: "is there an earlier row of this
-- aggregate still in the outbox?" is one probe of this index.
CREATE INDEX outbox_aggregate_idx ON outbox (aggregate_id, id);

-- Every event, delivered or not, with its status: what operators and tests
-- read. A row is in exactly one of the two tables in any snapshot, because
-- the move is one statement.
CREATE VIEW outbox_events AS
SELECT event_id, id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers,
       status, attempts, last_error, next_attempt_at, occurred_at, created_at,
       NULL::timestamptz AS published_at
FROM outbox
UNION ALL
SELECT event_id, id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers,
       'PUBLISHED', attempts, last_error, NULL, occurred_at, created_at, published_at
FROM outbox_published;

-- +goose Down
DROP VIEW outbox_events;
DROP INDEX outbox_pending_idx;
DROP INDEX outbox_aggregate_idx;
COMMENT ON COLUMN outbox.attempts IS NULL;
ALTER TABLE outbox
    DROP CONSTRAINT outbox_status_valid,
    ADD COLUMN lease_owner text,
    ADD COLUMN lease_expires_at timestamptz,
    ADD COLUMN published_at timestamptz,
    SET (fillfactor = 50);
INSERT INTO outbox (event_id, id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers,
                    status, attempts, last_error, occurred_at, created_at, published_at)
OVERRIDING SYSTEM VALUE
SELECT event_id, id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers,
       'PUBLISHED', attempts, last_error, occurred_at, created_at, published_at
FROM outbox_published;
DROP TABLE outbox_published;
ALTER TABLE outbox
    ADD CONSTRAINT outbox_status_valid
        CHECK (status IN ('PENDING', 'PUBLISHING', 'PUBLISHED', 'FAILED')),
    ADD CONSTRAINT outbox_published_consistent
        CHECK ((status = 'PUBLISHED') = (published_at IS NOT NULL)),
    ADD CONSTRAINT outbox_lease_consistent
        CHECK ((status = 'PUBLISHING') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL));
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_aggregate_unpublished_idx ON outbox (aggregate_id, id) WHERE published_at IS NULL;
CREATE INDEX outbox_published_at_brin ON outbox USING brin (published_at) WITH (autosummarize = on);
