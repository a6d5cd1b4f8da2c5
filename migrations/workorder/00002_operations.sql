-- +goose Up
-- Every privileged operation (replay, cleanup, re-hand-off): who, why, what.
CREATE TABLE operator_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action      text        NOT NULL,
    actor       text        NOT NULL CHECK (length(actor) BETWEEN 1 AND 200),
    ticket      text        NOT NULL CHECK (length(ticket) BETWEEN 1 AND 200),
    dry_run     boolean     NOT NULL DEFAULT false,
    params      jsonb       NOT NULL DEFAULT '{}',
    affected    integer     NOT NULL DEFAULT 0,
    occurred_at timestamptz NOT NULL DEFAULT now()
);

-- Provider events applied to a work order, kept for the order's lifetime
-- (unlike inbox rows, which cleanup removes): how the correlation knows that
-- THIS exact event was already applied (F6 duplicate) even after its inbox
-- row is gone, and why a NEW tranche for a completed order is not one.
CREATE TABLE work_order_applied_events (
    source          text        NOT NULL,
    event_id        text        NOT NULL,
    work_order_id   uuid        NOT NULL REFERENCES work_orders (id),
    event_type      text        NOT NULL,
    completed_items integer     NOT NULL DEFAULT 0,
    inbox_id        bigint,
    applied_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, event_id)
);
CREATE INDEX work_order_applied_events_order_idx ON work_order_applied_events (work_order_id);

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
DROP TABLE work_order_applied_events;
DROP TABLE operator_audit;
