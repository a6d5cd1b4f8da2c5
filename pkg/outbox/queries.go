package outbox

// SQL of the outbox, one named constant per statement. The schema and the
// reasons for its indexes are in migrations/workorder/00002_outbox.sql.

// qAppend inserts a whole Append call in one statement (arrays, one round
// trip), so the table's statement trigger sends one NOTIFY for it.
const qAppend = `
INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version,
                    payload, headers, occurred_at)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[],
                     $6::bytea[], $7::jsonb[], $8::timestamptz[])`

// qClaim claims up to $2 rows after the cursor $1 in one short transaction
// (autocommit): they become PUBLISHING with lease token $4 until $3 + $5.
// The dispatch happens after this commits, outside any transaction.
//
// Why it is shaped this way:
//   - "id > $1" (keyset) descends the partial index straight to the cursor.
//     Ordering by id from the start of the index (the seed's plain claim)
//     walks every dead entry left by recently published rows until vacuum
//     removes them; that claim decays from ~15k to ~3k rows/s on a backlog
//     (docs/adr/0002-outbox-polling-vs-cdc.md). The relay runs the same query
//     with $1 = 0 on every sweep and rewinds $1 on NOTIFY, because an id
//     behind the cursor can still appear: ids are assigned at insert but
//     become visible at commit, out of id order (watermill issue #311).
//   - FOR UPDATE SKIP LOCKED lets any number of relays claim disjoint rows
//     without waiting on each other. A row another relay locked is skipped;
//     one it already claimed fails the status test when re-checked on the
//     latest version.
//   - A PUBLISHING row whose lease expired belongs to a relay presumed dead:
//     it is claimed again (at-least-once; consumers deduplicate on event_id).
//   - The NOT EXISTS guard keeps per-aggregate order across replicas: a row
//     is not claimed while an earlier row of its aggregate is unpublished
//     (pending, publishing, waiting for a retry, or FAILED) unless that
//     earlier row is in this very batch, in which case the relay dispatches
//     both, in id order. The probe uses outbox_aggregate_unpublished_idx.
//   - The outer SELECT returns one row even when nothing was claimable, with
//     the last candidate id and the candidate count: the cursor moves past
//     blocked candidates, and a full candidate batch means "claim again now".
const qClaim = `
WITH candidates AS (
    SELECT id, aggregate_id
    FROM outbox
    WHERE published_at IS NULL
      AND id > $1
      AND ((status = 'PENDING' AND (next_attempt_at IS NULL OR next_attempt_at <= $3))
        OR (status = 'PUBLISHING' AND lease_expires_at <= $3))
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), claimable AS (
    SELECT c.id
    FROM candidates c
    WHERE NOT EXISTS (
        SELECT 1 FROM outbox e
        WHERE e.aggregate_id = c.aggregate_id
          AND e.id < c.id
          AND e.published_at IS NULL
          AND e.id NOT IN (SELECT id FROM candidates))
), claimed AS (
    UPDATE outbox o
    SET status = 'PUBLISHING', attempts = o.attempts + 1,
        lease_owner = $4, lease_expires_at = $3::timestamptz + $5::interval
    FROM claimable c
    WHERE o.id = c.id AND o.published_at IS NULL
    RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.schema_version,
              o.payload, o.headers, o.occurred_at, o.attempts
)
SELECT s.scanned, s.scanned_to, c.id, c.event_id, c.aggregate_type, c.aggregate_id, c.event_type,
       c.schema_version, c.payload, c.headers, c.occurred_at, c.attempts
FROM (SELECT count(*) AS scanned, coalesce(max(id), $1) AS scanned_to FROM candidates) s
LEFT JOIN claimed c ON true
ORDER BY c.id`

// qMarkPublished marks dispatched rows in one statement. The lease token is
// the fence: a row whose lease expired and was claimed by another relay is
// not touched (that relay will mark it), and its Commit does not run.
const qMarkPublished = `
UPDATE outbox
SET status = 'PUBLISHED', published_at = $2, last_error = NULL,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = ANY($1::bigint[]) AND published_at IS NULL AND lease_owner = $3
RETURNING id`

// qMarkUnpublished settles every row of a batch that was not published, in
// one statement: back to PENDING with a retry time (transient failure), to
// FAILED (permanent, unknown type, attempts exhausted), or back to PENDING
// without using an attempt (released: never dispatched, e.g. behind a failed
// event of its aggregate, or on shutdown). Fenced by the lease token.
const qMarkUnpublished = `
UPDATE outbox o
SET status = u.status,
    attempts = o.attempts - u.refund,
    last_error = coalesce(u.err, o.last_error),
    next_attempt_at = coalesce(u.next_attempt_at, o.next_attempt_at),
    lease_owner = NULL, lease_expires_at = NULL
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::timestamptz[], $5::int[])
     AS u(id, status, err, next_attempt_at, refund)
WHERE o.id = u.id AND o.published_at IS NULL AND o.lease_owner = $6`

// qCleanup deletes one bounded batch of PUBLISHED rows older than the
// retention, found through the BRIN index on published_at (no ORDER BY: any
// expired rows will do, and sorting would read them all). Unpublished rows
// (PENDING, PUBLISHING, FAILED) never match: published_at is NULL for them.
const qCleanup = `
DELETE FROM outbox
WHERE event_id IN (
    SELECT event_id FROM outbox
    WHERE published_at < $1 AND status = 'PUBLISHED'
    LIMIT $2)`

// qStats reads the gauges with bounded cost: the counts read at most $1
// entries of the unpublished index (a huge backlog reports the cap; the age
// is the signal that matters then), and the oldest unpublished row is the
// first non-FAILED entry in id order.
const qStats = `
SELECT
    count(*) FILTER (WHERE status <> 'FAILED') AS pending,
    count(*) FILTER (WHERE status = 'FAILED') AS failed,
    (SELECT created_at FROM outbox
     WHERE published_at IS NULL AND status IN ('PENDING', 'PUBLISHING')
     ORDER BY id LIMIT 1) AS oldest_created_at
FROM (SELECT status FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT $1) unpublished`
