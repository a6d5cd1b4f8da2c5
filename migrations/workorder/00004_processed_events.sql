-- +goose Up
-- Idempotent-consumer markers (pkg/dedup) of the work-order service's plain
-- consumers, today the InvoiceIssued consumer (services/workorder/internal/
-- invoicing). The completion path uses the inbox (00003) instead: it needs
-- ordering and correlation; InvoiceIssued needs only "apply once".
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

-- InvoiceIssued messages that cannot be applied: unparseable, or for an order
-- that is not COMPLETED (by causality it must be: billing only invoices what
-- this service announced as completed, so retrying would not help). Kept with
-- raw bytes and reason, counted and alarmed; replayed by an operator through
-- the same apply path.
CREATE TABLE parked_billing_events (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   text        NOT NULL UNIQUE,
    event_id     text,
    work_order_id uuid,
    attributes   jsonb       NOT NULL DEFAULT '{}',
    data         bytea       NOT NULL,
    reason       text        NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    replayed_at  timestamptz,
    replayed_by  text,
    ticket       text
);
CREATE INDEX parked_billing_events_open_idx ON parked_billing_events (id) WHERE replayed_at IS NULL;

-- +goose Down
DROP TABLE parked_billing_events;
DROP TABLE processed_events;
