-- +goose Up
-- Placeholder replaced by the work-order schema.
SELECT 1;
-- +goose Down
SELECT 1;
