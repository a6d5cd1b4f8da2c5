-- +goose Up
-- API idempotency keys (pkg/idempotency, docs/adr/0003-api-idempotency-keys.md).
-- A row is inserted and completed in the SAME transaction as the business
-- write it protects, so a committed key always has its order and response,
-- and a rolled-back request leaves no key behind.
CREATE TABLE {schema}.idempotency_keys (
    -- The operation the key belongs to (e.g. the gRPC full method name): one
    -- key value may be reused by a client on different operations.
    scope        text        NOT NULL,
    key          text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    -- SHA-256 of the deterministic protobuf encoding of the request.
    request_hash bytea       NOT NULL CHECK (length(request_hash) = 32),
    -- Protobuf encoding of the original response. NULL only inside the
    -- claiming transaction, never in a committed row.
    response     bytea,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- After this the key is forgotten: a reuse is a new request.
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
-- The batched cleanup deletes the oldest expired keys first.
CREATE INDEX idempotency_keys_expires_idx ON {schema}.idempotency_keys (expires_at);

-- +goose Down
DROP TABLE {schema}.idempotency_keys;
