-- +goose Up
-- Transactional outbox (ADR 0001, ADR 0002). A business
-- transaction inserts its events here (pkg/outbox.Append); relays claim,
-- dispatch and mark them. The same file creates the billing outbox.
--
-- SUPERSEDED IN PART: the lease columns, the PUBLISHED state in this table
-- and its partial indexes were replaced by 00005_outbox_published.sql
-- (billing: 00003), where the current status machine is described. This file
-- is kept as applied; read the two together.
--
-- Original status machine (CHECK below):
--   PENDING    --claim-->      PUBLISHING (lease_owner, lease_expires_at set)
--   PUBLISHING --dispatched--> PUBLISHED  (published_at set; deleted after retention)
--   PUBLISHING --transient-->  PENDING    (next_attempt_at = now + backoff)
--   PUBLISHING --permanent, unknown type, or attempts exhausted--> FAILED (terminal)
--   PUBLISHING --lease expired--> claimed again by any relay (the claimer is presumed dead)
-- FAILED keeps blocking later events of its aggregate until an operator
-- requeues it (docs/runbooks/outbox-relay-stalled.md).

CREATE TABLE outbox (
    -- The message id downstream: the key every consumer deduplicates on.
    event_id         uuid        PRIMARY KEY,
    -- Claim order. Assigned at insert, so transactions can commit out of id
    -- order: the relay's keyset cursor is always paired with a sweep and a
    -- rewind on NOTIFY (see pkg/outbox/queries.go). No index of its own: every
    -- lookup by id is on an unpublished row and uses outbox_unpublished_idx.
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
        CONSTRAINT outbox_status_valid
        CHECK (status IN ('PENDING', 'PUBLISHING', 'PUBLISHED', 'FAILED')),
    -- Dispatch attempts so far, counted at claim time (a relay that crashes
    -- mid-dispatch has used an attempt, so a poison row cannot loop forever).
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error       text,
    -- Earliest time a PENDING row may be claimed again after a transient
    -- failure (backoff); NULL: no backoff pending, claim at once.
    next_attempt_at  timestamptz,
    -- Fencing token of the claim ("<relay id>#<claim number>") and its expiry;
    -- the mark only touches a row whose token is still the marker's.
    lease_owner      text,
    lease_expires_at timestamptz,
    -- Business time of the fact, set by the producer...
    occurred_at      timestamptz NOT NULL,
    -- ...distinct from the time the row was written (basis of the age alarm).
    created_at       timestamptz NOT NULL DEFAULT now(),
    published_at     timestamptz,
    CONSTRAINT outbox_published_consistent
        CHECK ((status = 'PUBLISHED') = (published_at IS NOT NULL)),
    CONSTRAINT outbox_lease_consistent
        CHECK ((status = 'PUBLISHING') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL))
) WITH (
    -- Free room on each page lets the claim (PENDING -> PUBLISHING, columns
    -- not in any index) be a HOT update: a new row version on the same page
    -- and no new index entries. Measured in pkg/outbox B1.
    fillfactor = 50
);

-- The claim index: every row not yet published (PENDING, PUBLISHING, FAILED),
-- in claim order. Partial, so it holds the backlog, not the retained
-- history. Its predicate is on published_at rather than status on purpose:
-- a column in an index predicate makes every update of it non-HOT, and the
-- claim changes status; only the mark (PUBLISHED) leaves the index.
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;

-- The per-aggregate ordering guard: "is there an earlier unpublished event of
-- this aggregate?" is one probe of this small index.
CREATE INDEX outbox_aggregate_unpublished_idx ON outbox (aggregate_id, id) WHERE published_at IS NULL;

-- Retention cleanup finds PUBLISHED rows older than the retention. BRIN, not
-- B-tree: rows are published roughly in the order they were written, so
-- page ranges summarise well, and the index costs almost nothing on the mark
-- (a B-tree entry per published row cost the relay a third of its writes).
CREATE INDEX outbox_published_at_brin ON outbox USING brin (published_at) WITH (autosummarize = on);

-- Wakes the relays (LISTEN outbox) when events commit: one notification per
-- INSERT statement, delivered at commit (never for a rolled-back one). The
-- payload is the lowest id inserted, so a relay whose cursor has already
-- passed it (a transaction that committed out of id order) rewinds at once.
-- +goose StatementBegin
CREATE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', (SELECT min(id)::text FROM inserted));
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- +goose Down
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();
DROP TABLE outbox;
