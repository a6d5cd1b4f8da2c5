-- +goose Up
-- Keys are scoped by the authenticated caller too (Request.Principal, e.g.
-- the subject of the caller's verified token): two callers may use the same
-- key without seeing, probing or taking each other's. Existing rows were
-- written without authentication and keep the empty principal. Rebuilding
-- the primary key locks the table for its length; the table holds at most a
-- retention's worth of keys (24 h by default).
ALTER TABLE {schema}.idempotency_keys
    ADD COLUMN principal text NOT NULL DEFAULT '' CHECK (length(principal) <= 255),
    DROP CONSTRAINT idempotency_keys_pkey,
    ADD PRIMARY KEY (scope, principal, key);

-- +goose Down
DELETE FROM {schema}.idempotency_keys WHERE principal <> '';
ALTER TABLE {schema}.idempotency_keys
    DROP CONSTRAINT idempotency_keys_pkey,
    DROP COLUMN principal,
    ADD PRIMARY KEY (scope, key);
