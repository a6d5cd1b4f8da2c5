-- +goose Up
-- Every change of the fault knobs (UpdateFaults, action faults.update): who,
-- under which ticket, the knobs before and after. Written in the transaction
-- that decides the change, so no knob setting is in force unrecorded. The
-- same shape as the work-order and billing services' operator_audit, so one
-- query (pkg/operator ListAudit) reads any of the databases.
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
