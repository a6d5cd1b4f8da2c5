-- +goose Up
-- The notification that wakes the relays moves out of the inserting
-- transaction: Store.Ingest sends it after its commit (pgnotify.Announce).
-- A NOTIFY inside the transaction, as this trigger sent, holds PostgreSQL's
-- global notification lock from before the commit record to the end of the
-- commit, WAL flush included: every notifying commit of the server then
-- waits for the one before it, and group commit cannot batch them. Rows
-- inserted by other means (psql, another program) wake no relay: the relays
-- find them by polling.
DROP TRIGGER inbox_notify ON {schema}.inbox;
DROP FUNCTION {schema}.inbox_notify();

-- +goose Down
-- +goose StatementBegin
CREATE FUNCTION {schema}.inbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE status = 'OPEN') THEN
        PERFORM pg_notify(left('{schema}.inbox', 63), '');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER inbox_notify AFTER INSERT ON {schema}.inbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.inbox_notify();
