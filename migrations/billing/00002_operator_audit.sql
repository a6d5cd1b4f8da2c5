-- +goose Up
-- Every privileged operation of billing's operators (dead-letter replay,
-- parked-message replay): who, under which ticket, what. The same shape as
-- the work-order service's operator_audit, so one query reads either
-- database. leasequeue_job_audit keeps the job retries (pkg/leasequeue);
-- parked_messages records who replayed each row as well (pkg/parked).
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

-- +goose Down
DROP TABLE operator_audit;
