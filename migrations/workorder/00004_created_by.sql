-- +goose Up
-- The authenticated caller that created the order (the subject of its
-- token, pkg/server CallerFrom): who may cancel it and whose listing shows it.
-- Orders created before authentication keep the empty creator: only an
-- operator sees or cancels them.
ALTER TABLE work_orders ADD COLUMN created_by text NOT NULL DEFAULT '' CHECK (length(created_by) <= 255);
-- A caller's listing (orders.qListByCreator) is one range of this index,
-- newest first, like the operators' listing on work_orders_created_idx.
CREATE INDEX work_orders_created_by_idx ON work_orders (created_by, created_at DESC, id DESC);

-- +goose Down
DROP INDEX work_orders_created_by_idx;
ALTER TABLE work_orders DROP COLUMN created_by;
