-- +goose Up
-- The dispatch journal: how the outbox relay charges an attempt to an event
-- whose dispatch kills the relay process (ADR 0002, "A poison event that
-- crashes the relay process"). A crash rolls the claim transaction back, so
-- nothing in outbox records the attempt; a row here, committed on its own
-- before the dispatch, survives it. The same file creates the billing one.
--
--   before dispatching a claimed batch      INSERT (ids, exclusive = false), own commit
--   before dispatching each suspect alone   INSERT, then UPDATE, ids = {that id},
--                                           exclusive = true, own commit
--   settling the batch                      DELETE, in the claim transaction
--
-- A row whose events a later claim holds was left by a relay that died (or
-- rolled back) mid-batch. Its events become suspects, dispatched one at a
-- time with nothing else in flight in that process; an exclusive row left
-- behind names the event whose dispatch died, and the next claim charges it
-- an attempt (FAILED at the relay's MaxAttempts).
--
-- UNLOGGED: the journal costs no WAL and no fsync on the relay's hot path.
-- A database crash empties it, which forgets at most one crash per event in
-- flight; a crash loop is charged from the next crash on.
CREATE UNLOGGED TABLE outbox_dispatching (
    batch_id   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- outbox.id of the events dispatched.
    ids        bigint[]    NOT NULL,
    -- One event, dispatched with nothing else in flight in its process: a
    -- crash can be charged to it.
    exclusive  boolean     NOT NULL,
    relay_id   text        NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE outbox_dispatching;
