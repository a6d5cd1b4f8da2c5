-- +goose Up
-- Idempotent-consumer markers (pkg/consumer). The primary key is where the
-- correctness lives: the marker is inserted first, in the same transaction as
-- the effect, and a second delivery of the same event finds the key taken.
-- consumer scopes the marker: two consumers may legitimately process one event.
CREATE TABLE {schema}.processed_events (
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
CREATE INDEX processed_events_processed_at_idx ON {schema}.processed_events (processed_at);

-- +goose Down
DROP TABLE {schema}.processed_events;
