-- +goose Up
-- Work orders and their lifecycle (the rules: services/workorder/internal/
-- orders). The pattern packages' tables (pkg/outbox, pkg/inbox, pkg/consumer,
-- pkg/idempotency, pkg/parked) live in the same database, applied first by
-- migrations.WorkOrder, so that a business change and its message commit in
-- one local transaction.

CREATE TABLE work_orders (
    id               uuid        PRIMARY KEY,
    customer_id      text        NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 64),
    description      text        NOT NULL CHECK (length(description) BETWEEN 1 AND 2000),
    positions        integer     NOT NULL CHECK (positions BETWEEN 1 AND 100000),
    currency_code    text        NOT NULL CHECK (currency_code ~ '^[A-Z]{3}$'),
    unit_price_minor bigint      NOT NULL CHECK (unit_price_minor >= 0),
    status           text        NOT NULL DEFAULT 'CREATED'
        CHECK (status IN ('CREATED', 'HANDED_OFF', 'COMPLETED', 'INVOICED', 'CANCELLED')),
    -- Sum of the provider's completion tranches applied so far (F14: one
    -- order may complete in several distinct business events).
    completed_items  integer     NOT NULL DEFAULT 0 CHECK (completed_items >= 0),
    provider_job_id  text,
    invoice_id       uuid,
    version          bigint      NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- List pages are keyset-paginated newest first, optionally by status.
CREATE INDEX work_orders_created_idx ON work_orders (created_at DESC, id DESC);
CREATE INDEX work_orders_status_created_idx ON work_orders (status, created_at DESC, id DESC);

-- Every status transition, with its cause: the order's audit trail.
CREATE TABLE work_order_transitions (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    work_order_id uuid        NOT NULL REFERENCES work_orders (id),
    from_status   text,
    to_status     text        NOT NULL,
    cause         text        NOT NULL,
    occurred_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX work_order_transitions_order_idx ON work_order_transitions (work_order_id, id);

-- The explicit waiting point: recorded in the transaction that
-- marks the hand-off published, consumed by the correlation that completes
-- the order. There is deliberately NO unique constraint on open waiting
-- points per order: a manual re-hand-off can create a second one, and the
-- correlation relay must see that ambiguity (F7) and park, not guess.
CREATE TABLE waiting_points (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    work_order_id   uuid        NOT NULL REFERENCES work_orders (id),
    kind            text        NOT NULL DEFAULT 'PROVIDER_COMPLETION',
    provider_job_id text,
    cause           text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    consumed_at     timestamptz,
    consumed_by     text
);
-- Correlation looks up the open waiting points of one order.
CREATE INDEX waiting_points_open_idx ON waiting_points (work_order_id) WHERE consumed_at IS NULL;

-- +goose Down
DROP TABLE waiting_points;
DROP TABLE work_order_transitions;
DROP TABLE work_orders;
