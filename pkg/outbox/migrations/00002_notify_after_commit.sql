-- +goose Up
-- The notification that wakes the relays moves out of the inserting
-- transaction: outbox.Append sends it (pgnotify.Send), after the commit when
-- the writer began its transaction under pgnotify.Defer. A NOTIFY inside the
-- transaction, as this trigger sent, holds PostgreSQL's global notification
-- lock from before the commit record to the end of the commit, WAL flush
-- included: every notifying commit of the server then waits for the one
-- before it, and group commit cannot batch them (ADR 0002, revision 4).
-- Rows inserted by other means (psql, another program) wake no relay: the
-- relays find them by polling and by the sweep.

DROP TRIGGER outbox_notify ON {schema}.outbox;
DROP FUNCTION {schema}.outbox_notify();

-- +goose Down
-- +goose StatementBegin
CREATE FUNCTION {schema}.outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{schema}.outbox', (SELECT min(id)::text FROM inserted));
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_notify AFTER INSERT ON {schema}.outbox
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.outbox_notify();
