-- +goose Up
-- The open waiting points of an order are looked up and locked in
-- (work_order_id, id) order (orders.qLockOpenWaitingPoints): the index gives
-- both the lookup and the order, so no plan has a reason to walk the primary
-- key and filter the whole table instead.
CREATE INDEX waiting_points_open_order_idx ON waiting_points (work_order_id, id) WHERE consumed_at IS NULL;
DROP INDEX waiting_points_open_idx;
ALTER INDEX waiting_points_open_order_idx RENAME TO waiting_points_open_idx;

-- +goose Down
CREATE INDEX waiting_points_open_single_idx ON waiting_points (work_order_id) WHERE consumed_at IS NULL;
DROP INDEX waiting_points_open_idx;
ALTER INDEX waiting_points_open_single_idx RENAME TO waiting_points_open_idx;
