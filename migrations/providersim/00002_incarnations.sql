-- +goose Up

-- incarnations: how many times each instance (env INSTANCE_ID; '' when unset)
-- has started against this database. The fault generator's stream is derived
-- from (PROVIDER_FAULT_SEED, instance, starts): with a fixed seed, start 1, 2,
-- 3 ... of an instance each draw their own fixed plans, so a restart does not
-- replay the draws of the start before it (a publish_then_crash drawn first
-- would otherwise crash every start the same way).
CREATE TABLE incarnations (
    instance    text        PRIMARY KEY,
    starts      bigint      NOT NULL CHECK (starts >= 1),
    started_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE incarnations;
