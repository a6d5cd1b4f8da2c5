-- +goose Up
-- Every privileged operation (replay, cleanup, re-hand-off): who, why, what.
-- The service's one audit log: pkg/inbox's operator actions are routed here
-- (inbox.WithAudit in services/workorder/internal/admin), not to inbox_audit.
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

-- +goose Down
DROP TABLE work_order_applied_events;
DROP TABLE operator_audit;
