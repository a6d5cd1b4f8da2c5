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

// claimLockNamespace is the first key of the two-key advisory lock that
// serialises claims (qClaimLock), so it cannot collide with single-bigint
// advisory locks or with other packages' namespaces (pkg/idempotency uses
// 0x1de7). Advisory locks are per database, and each service has its own.
const (
	claimLockNamespace int32 = 0x0b0c
	claimLockKey       int32 = 1
)

// A claim is three statements sent in one round trip (a pgx.Batch: one
// pipeline ending in one Sync, hence one implicit transaction):
// qClaimLock, qExpireLeases, qClaim. Nothing is written to the claimed
// rows: the claim inserts one outbox_leases row for the batch, and the mark
// is the only write an event gets on its way out (ADR 0002).

// qClaimLock serialises claims across relays until the claim commits. It is
// what makes a lease row sufficient: without it, two claims running at once
// would each miss the other's uncommitted lease and claim the same rows. In
// READ COMMITTED every statement takes a fresh snapshot, and an advisory lock
// is released only after its transaction's commit is visible, so the
// statements that follow see every lease committed by earlier claims.
// Claims are short (a read of one batch and one insert); marks, the per-row
// writes, are not serialised.
const qClaimLock = `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`

// qExpireLeases deletes leases that expired (their relay is presumed dead)
// and charges each of their unsettled rows the attempt the dead relay used:
// a poison event that kills its relay cannot loop forever, it goes to FAILED
// when the attempts reach $2. The rows become claimable by qClaim at once.
// The claimed ids are expanded into an array matched with "id = ANY", an
// index lookup whatever the plan; the planner may otherwise join the id
// ranges with a scan of the whole table (seen with cached generic plans),
// and this runs on every claim, with nothing expired almost always.
const qExpireLeases = `
WITH expired AS (
    DELETE FROM outbox_leases WHERE expires_at <= $1 RETURNING token, claimed
)
UPDATE outbox o
SET attempts = o.attempts + 1,
    status = CASE WHEN o.attempts + 1 >= $2 THEN 'FAILED' ELSE o.status END,
    last_error = CASE WHEN o.attempts + 1 >= $2 THEN 'attempts exhausted (' || (o.attempts + 1) || '): ' ELSE '' END
        || 'lease ' || (SELECT string_agg(token, ', ') FROM expired)
        || ' expired before its relay settled the event (relay crashed or stalled mid-dispatch)'
WHERE o.id = ANY (ARRAY(SELECT generate_series(lower(r), upper(r) - 1) FROM expired, unnest(claimed) AS r))
  AND o.published_at IS NULL AND o.status = 'PENDING'`

// qClaim claims up to $2 rows after the cursor $1 by inserting one lease
// ($4, owner $6) that expires at $3 + $5; the rows themselves are not
// written. The dispatch happens after the claim commits, outside any
// transaction.
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
//   - No FOR UPDATE: claims are serialised by qClaimLock, and rows of another
//     relay's live lease are skipped. The leases are read once into a CTE
//     (a handful of rows), not probed per candidate in the table, whose dead
//     versions pile up while vacuum is held back.
//   - The "earlier" guard keeps per-aggregate order across replicas: a row
//     is not claimed while an earlier row of its aggregate is unpublished
//     (pending, leased by another relay, waiting for a retry, or FAILED)
//     unless that earlier row is in this very batch, in which case the relay
//     dispatches both, in id order. It is a LATERAL ... LIMIT 1 rather than
//     NOT EXISTS on purpose: the LIMIT keeps the planner from turning it into
//     an anti-join, so it stays one short probe of
//     outbox_aggregate_unpublished_idx per candidate. As a (merge) anti-join,
//     which the cached generic plan of a prepared statement chose, it read
//     the whole index on every claim and B1 with two relays fell from ~20k to
//     ~3k rows/s.
//   - The outer SELECT returns one row even when nothing was claimable, with
//     the last candidate id and the candidate count: the cursor moves past
//     blocked candidates, and a full candidate batch means "claim again now".
const qClaim = `
WITH active AS MATERIALIZED (
    SELECT claimed FROM outbox_leases
), candidates AS (
    SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.schema_version,
           o.payload, o.headers, o.occurred_at, o.attempts
    FROM outbox o
    WHERE o.published_at IS NULL
      AND o.id > $1
      AND o.status = 'PENDING'
      AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= $3)
      AND NOT EXISTS (SELECT 1 FROM active a WHERE a.claimed @> o.id)
    ORDER BY o.id
    LIMIT $2
), claimable AS (
    SELECT c.*
    FROM candidates c
    LEFT JOIN LATERAL (
        SELECT 1 AS found FROM outbox e
        WHERE e.aggregate_id = c.aggregate_id
          AND e.id < c.id
          AND e.published_at IS NULL
          AND e.id NOT IN (SELECT id FROM candidates)
        LIMIT 1
    ) earlier ON true
    WHERE earlier.found IS NULL
), lease AS (
    INSERT INTO outbox_leases (token, relay_id, claimed, claimed_at, expires_at)
    SELECT $4, $6, range_agg(int8range(id, id, '[]')), $3, $3::timestamptz + $5::interval
    FROM claimable
    HAVING count(*) > 0
)
SELECT s.scanned, s.scanned_to, c.id, c.event_id, c.aggregate_type, c.aggregate_id, c.event_type,
       c.schema_version, c.payload, c.headers, c.occurred_at, c.attempts + 1
FROM (SELECT count(*) AS scanned, coalesce(max(id), $1) AS scanned_to FROM candidates) s
LEFT JOIN claimable c ON true
ORDER BY c.id`

// qSettle records a batch's outcome and ends its lease, in one statement:
// rows $3 become PUBLISHED; rows $4 go back to PENDING with a retry time or
// to FAILED (status $5, error $6, retry time $7); both count the attempt.
// Rows of the batch in neither list (not dispatched: behind a failed event
// of their aggregate, cut off by shutdown) are not written at all: deleting
// the lease releases them. Deleting the lease is the fence: when it expired
// and another relay's claim deleted it, nothing here matches, and the rows
// are that relay's to dispatch and mark (held = 0: a duplicate follows).
const qSettle = `
WITH lease AS (
    DELETE FROM outbox_leases WHERE token = $1 RETURNING token
), published AS (
    UPDATE outbox o
    SET status = 'PUBLISHED', published_at = $2, attempts = o.attempts + 1,
        last_error = NULL, next_attempt_at = NULL
    FROM lease
    WHERE o.id = ANY($3::bigint[]) AND o.published_at IS NULL
    RETURNING o.id
), unpublished AS (
    UPDATE outbox o
    SET status = u.status, attempts = o.attempts + 1, last_error = u.err, next_attempt_at = u.next_attempt_at
    FROM lease, unnest($4::bigint[], $5::text[], $6::text[], $7::timestamptz[]) AS u(id, status, err, next_attempt_at)
    WHERE o.id = u.id AND o.published_at IS NULL
    RETURNING o.id
)
SELECT (SELECT count(*) FROM lease) AS held, coalesce((SELECT array_agg(id) FROM published), '{}') AS marked`

// qMarkPublishedInTx marks rows $2 PUBLISHED inside the transaction that
// runs their dispatchers' Commits, without ending the lease (qSettle does,
// after). Locking the lease row is the fence: it exists only while the lease
// is this relay's, and the lock keeps another relay's claim from deleting it
// until this transaction ends.
const qMarkPublishedInTx = `
WITH lease AS (
    SELECT token FROM outbox_leases WHERE token = $1 FOR UPDATE
)
UPDATE outbox o
SET status = 'PUBLISHED', published_at = $3, attempts = o.attempts + 1,
    last_error = NULL, next_attempt_at = NULL
FROM lease
WHERE o.id = ANY($2::bigint[]) AND o.published_at IS NULL
RETURNING o.id`

// qCleanup deletes one bounded batch of PUBLISHED rows older than the
// retention, found through the BRIN index on published_at (no ORDER BY: any
// expired rows will do, and sorting would read them all). Unpublished rows
// (PENDING, FAILED) never match: published_at is NULL for them.
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
     WHERE published_at IS NULL AND status = 'PENDING'
     ORDER BY id LIMIT 1) AS oldest_created_at
FROM (SELECT status FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT $1) unpublished`
