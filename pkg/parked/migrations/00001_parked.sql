-- +goose Up
-- Messages a consumer could not process (pkg/parked): unparseable, wrong
-- schema version, invalid content, bytes the database refuses, not applicable
-- to the current state. Kept with their raw bytes and the reason, then acked:
-- a poison message is never lost and never retried forever. Every text
-- column holds what pkg/pgtext made storable; data is the payload as received.
CREATE TABLE {schema}.parked_messages (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The subscription (or, for another broker, the consumer) the message
    -- came from: Pub/Sub message ids are unique per topic, so each of a
    -- topic's subscriptions may park the same message once.
    subscription text        NOT NULL CHECK (length(subscription) BETWEEN 1 AND 255),
    message_id   text        NOT NULL,
    -- NULL when unknown or not storable as text (the reason then says so).
    event_id     text,
    event_type   text,
    -- What the message is about in the consumer's terms (a work order id),
    -- so that an operator finds the parked messages of one entity.
    subject      text,
    attributes   jsonb       NOT NULL DEFAULT '{}',
    data         bytea       NOT NULL,
    reason       text        NOT NULL CHECK (reason <> ''),
    parked_at    timestamptz NOT NULL DEFAULT now(),
    -- Set together, in the transaction that applied the message, by an
    -- operator's replay (Store.Replay): who, under which ticket.
    replayed_at  timestamptz,
    replayed_by  text,
    ticket       text,
    -- A redelivered poison message is parked once.
    UNIQUE (subscription, message_id),
    CONSTRAINT parked_messages_replay_audited CHECK (
        (replayed_at IS NULL AND replayed_by IS NULL AND ticket IS NULL)
        OR (replayed_at IS NOT NULL AND length(replayed_by) BETWEEN 1 AND 200 AND length(ticket) BETWEEN 1 AND 200))
);
-- List and CountByReason read the open rows only; replayed rows stay for the
-- audit trail and are skipped by this index.
CREATE INDEX parked_messages_open_idx ON {schema}.parked_messages (id) WHERE replayed_at IS NULL;

-- +goose Down
DROP TABLE {schema}.parked_messages;
