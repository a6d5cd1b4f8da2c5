-- +goose Up
-- Transactional inbox (ADR 0007, variant 2). The receiver does ONE
-- insert per batch into `inbox` and acks only after commit; the correlation
-- relay applies OPEN entries later. Nothing here is ever deleted unless it is
-- resolved (APPLIED or DUPLICATE) and older than the retention: PARKED rows
-- and conflicts are kept until a person deals with them.

CREATE TABLE {schema}.inbox (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Who emitted the event (e.g. "provider"); with event_id the dedup key.
    source           text        NOT NULL CHECK (length(source) BETWEEN 1 AND 64),
    -- The emitter's business event id (stable across re-publishing), NOT the
    -- Pub/Sub message id and NOT (event_type, work_order_id): two tranches of
    -- one split completion (F14) are two rows. Poison without a usable id is
    -- keyed "pubsub-message:<message id>" so its redelivery dedups too.
    event_id         text        NOT NULL CHECK (length(event_id) BETWEEN 1 AND 200),
    event_type       text        NOT NULL DEFAULT '',
    schema_version   integer     NOT NULL DEFAULT 0,
    -- The per-key serialization domain of the relay (the work order id).
    -- NULL only for poison that carried no usable key.
    correlation_key  text,
    payload          bytea       NOT NULL,
    -- SHA-256 of payload: same event_id with another hash is a producer bug.
    payload_sha256   bytea       NOT NULL CHECK (length(payload_sha256) = 32),
    attributes       jsonb       NOT NULL DEFAULT '{}',
    message_id       text        NOT NULL DEFAULT '',
    delivery_attempt integer     NOT NULL DEFAULT 0,
    traceparent      text        NOT NULL DEFAULT '',
    tracestate       text        NOT NULL DEFAULT '',
    status           text        NOT NULL DEFAULT 'OPEN'
        CHECK (status IN ('OPEN', 'APPLIED', 'DUPLICATE', 'PARKED')),
    -- Why the entry was (last) parked. Kept when an operator reopens it, as
    -- history; only meaningful while status = 'PARKED'.
    park_reason      text,
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    received_at      timestamptz NOT NULL DEFAULT now(),
    processed_at     timestamptz,
    parked_at        timestamptz,
    CONSTRAINT inbox_source_event_uq UNIQUE (source, event_id)
);

-- Claim path. Partial on OPEN so the index holds only live work; the relay
-- walks it by id with a keyset cursor (and sweeps from the start on an
-- interval) because a plain "ORDER BY id LIMIT n" over a partial index decays
-- as every resolved row leaves a dead entry at its front (docs/performance.md).
CREATE INDEX inbox_open_idx ON {schema}.inbox (id) WHERE status = 'OPEN';
-- The NOT EXISTS ordering guard: "is there an older OPEN entry of this key?"
-- is one probe into this small partial index.
CREATE INDEX inbox_open_key_idx ON {schema}.inbox (correlation_key, id) WHERE status = 'OPEN';
-- Parked entries: listing, counting by reason, replay by time range.
CREATE INDEX inbox_parked_idx ON {schema}.inbox (received_at, id) WHERE status = 'PARKED';
-- Cleanup walks resolved rows oldest first.
CREATE INDEX inbox_resolved_idx ON {schema}.inbox (processed_at) WHERE status IN ('APPLIED', 'DUPLICATE');

-- Wake the relays when new entries commit. The channel is per schema,
-- "<schema>.inbox" (inbox.NotifyChannel), so that two inboxes in one database
-- do not wake each other; left() keeps it within PostgreSQL's 63-byte channel
-- limit, past which pg_notify would fail every insert. One notification per
-- inserting statement, not per row: a receiver batch of 500 wakes the relays
-- once. NOTIFY is delivered at commit, so a woken relay always sees the rows;
-- parked poison does not wake anyone. Polling stays the fallback.
-- +goose StatementBegin
CREATE FUNCTION {schema}.inbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE status = 'OPEN') THEN
        PERFORM pg_notify(left('{schema}.inbox', 63), '');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER inbox_notify AFTER INSERT ON {schema}.inbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.inbox_notify();

-- The inbox churns (insert, one update, delete): vacuum it early so dead
-- index entries do not pile up in front of the claim.
ALTER TABLE {schema}.inbox SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
                       autovacuum_analyze_scale_factor = 0.02);

-- A second payload under an already stored (source, event_id) with another
-- hash (a producer bug, never a silent duplicate). The first
-- payload stays in `inbox`; every different payload is kept here.
CREATE TABLE {schema}.inbox_conflicts (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source           text        NOT NULL,
    event_id         text        NOT NULL,
    payload          bytea       NOT NULL,
    payload_sha256   bytea       NOT NULL,
    attributes       jsonb       NOT NULL DEFAULT '{}',
    message_id       text        NOT NULL DEFAULT '',
    detected_at      timestamptz NOT NULL DEFAULT now(),
    -- Set by an operator once the producer bug is understood.
    resolved_at      timestamptz,
    CONSTRAINT inbox_conflicts_uq UNIQUE (source, event_id, payload_sha256)
);
CREATE INDEX inbox_conflicts_open_idx ON {schema}.inbox_conflicts (detected_at) WHERE resolved_at IS NULL;

-- Operator actions on the inbox (pkg/inbox Ops: replay, cleanup): who, why,
-- what, written in the transaction of the action. A service that keeps one
-- audit log of its own routes them there instead (inbox.WithAudit); this
-- table then stays empty.
CREATE TABLE {schema}.inbox_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action      text        NOT NULL,
    actor       text        NOT NULL CHECK (length(actor) BETWEEN 1 AND 200),
    ticket      text        NOT NULL CHECK (length(ticket) BETWEEN 1 AND 200),
    dry_run     boolean     NOT NULL DEFAULT false,
    params      jsonb       NOT NULL DEFAULT '{}',
    affected    integer     NOT NULL DEFAULT 0,
    occurred_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE {schema}.inbox_audit;
DROP TABLE {schema}.inbox_conflicts;
DROP TRIGGER inbox_notify ON {schema}.inbox;
DROP FUNCTION {schema}.inbox_notify();
DROP TABLE {schema}.inbox;
