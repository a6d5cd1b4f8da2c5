-- +goose Up
-- The outbox is a queue table: every row is inserted and soon deleted, and
-- its dead version costs the claim's index walk and the ordering probe until
-- vacuum removes it. After a long transaction ends (it held vacuum back),
-- the first vacuum has every row published meanwhile to remove; at the
-- default cost delay (2 ms per 200 cost units) it crawls, and the relay runs
-- slowly all that time. Unthrottled, it is over sooner: in B2 at the design's
-- length (10M backlog, 60 s hold) the relay's rate in the last 30 s of the
-- minute after the release went from 13.7k to 25.8k rows/s (ADR 0002). The
-- price is a burst of I/O on this one table's vacuum. The same file changes
-- the billing outbox.
ALTER TABLE outbox SET (autovacuum_vacuum_cost_delay = 0);

-- +goose Down
ALTER TABLE outbox RESET (autovacuum_vacuum_cost_delay);
