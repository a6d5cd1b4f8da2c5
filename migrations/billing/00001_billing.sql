-- +goose Up
-- Billing's own tables. With them in the same database (migrations.Billing
-- applies these sets first): pkg/outbox, so that an invoice and its
-- InvoiceIssued event commit in one local transaction; pkg/consumer
-- (processed_events) and pkg/parked (parked_messages: what the intake cannot
-- turn into work) for the intake; pkg/leasequeue (leasequeue_jobs,
-- leasequeue_job_audit) for the leased invoice work.

-- Invoice numbers are unique and human readable, not gapless: a rolled back
-- issue consumes a number. Jurisdictions that require gapless numbering need
-- a locked counter row instead (one writer at a time).
CREATE SEQUENCE invoice_number_seq;

CREATE TABLE invoices (
    id            uuid        PRIMARY KEY,
    number        text        NOT NULL UNIQUE,
    -- I3: exactly one invoice per work order, enforced by the database.
    work_order_id uuid        NOT NULL UNIQUE,
    customer_id   text        NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 64),
    currency_code text        NOT NULL CHECK (currency_code ~ '^[A-Z]{3}$'),
    total_minor   bigint      NOT NULL CHECK (total_minor >= 0),
    issued_at     timestamptz NOT NULL,
    -- The job and the event that produced the invoice, for reconciliation.
    job_id        bigint      NOT NULL REFERENCES leasequeue_jobs (id),
    source_event  text        NOT NULL
);
-- ListInvoices: keyset pages newest first.
CREATE INDEX invoices_issued_idx ON invoices (issued_at DESC, id DESC);

CREATE TABLE invoice_lines (
    invoice_id       uuid    NOT NULL REFERENCES invoices (id),
    line_no          integer NOT NULL CHECK (line_no >= 1),
    description      text    NOT NULL,
    quantity         integer NOT NULL CHECK (quantity >= 0),
    unit_price_minor bigint  NOT NULL CHECK (unit_price_minor >= 0),
    amount_minor     bigint  NOT NULL CHECK (amount_minor >= 0),
    PRIMARY KEY (invoice_id, line_no)
);

-- +goose Down
DROP TABLE invoice_lines;
DROP TABLE invoices;
DROP SEQUENCE invoice_number_seq;
