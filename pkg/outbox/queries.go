package outbox

import (
	"strings"

	"fmt"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// SQL of the outbox, one named constant per statement. The tables and the
// reasons for their indexes are in migrations/00001_outbox.sql. Every table
// is written {schema}.name and rendered once per constructor (newQueries,
// NewWriter) with the schema of WithSchema: no statement depends on the
// session's search_path.

// appendRows is the body of qAppend: a whole Append call in one statement
// (arrays, one round trip). It returns the lowest id it inserted, the
// payload of the notification Append sends (see notifyChannel).
const appendRows = ` (event_id, aggregate_type, aggregate_id, event_type, schema_version,
                    payload, headers, occurred_at)
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[],
                         $6::bytea[], $7::jsonb[], $8::timestamptz[])
    RETURNING id
)
SELECT min(id) FROM ins`

// qAppend inserts the events of an Append call (Writer.Append).
const qAppend = `WITH ins AS (INSERT INTO {schema}.outbox` + appendRows

// qAppendDefault is qAppend rendered for DefaultSchema at compile time, so
// that the package-level Append and a zero Writer render nothing per call.
const qAppendDefault = `WITH ins AS (INSERT INTO ` + DefaultSchema + `.outbox` + appendRows

// notifyChannel is the channel Append notifies once the events commit (with
// a pgdb.Tx, after the commit): one per schema, so that outboxes in
// different schemas of one database do not wake each other's relays. The
// payload is the lowest id inserted, so a relay whose cursor has already
// passed it (a transaction that committed out of id order) rewinds at once.
const notifyChannel = `{schema}.outbox`

// notifyChannelDefault is notifyChannel for DefaultSchema.
const notifyChannelDefault = DefaultSchema + `.outbox`

// queries are the statements of a Relay, rendered for its schema.
type queries struct {
	claim, markPublished, markUnpublished, cleanup, stats       string
	journal, journalMove, journalDone, journalGC, chargeCrashes string
	leaseClaim, leaseExpired, leaseClaimSuspect                 string
	leaseEndPredecessor                                         string
	leasePublish, leaseRecord, leaseRelease                     string
	notifyChannel                                               string
}

func newQueries(schema string) queries {
	r := func(q string) string { return pgmigrate.Render(q, schema) }
	markPublished := fmt.Sprintf(qMarkPublished, pgdb.AssertSQL("count(*) = cardinality($1::tid[])",
		`'mark published moved ' || count(*) || ' of ' || cardinality($1::tid[]) || ' locked rows'`))
	leasePublish := fmt.Sprintf(qLeasePublish, pgdb.AssertSQL("count(*) = 1",
		`'`+leaseLostMessage+`: moved ' || count(*) || ' rows'`))
	return queries{
		claim:               r(qClaim),
		markPublished:       r(markPublished),
		markUnpublished:     r(qMarkUnpublished),
		cleanup:             r(qCleanup),
		stats:               r(qStats),
		journal:             r(qJournal),
		journalMove:         r(qJournalMove),
		journalDone:         r(qJournalDone),
		journalGC:           r(qJournalGC),
		chargeCrashes:       r(qChargeCrashes),
		leaseClaim:          r(qLeaseClaim),
		leaseExpired:        r(qLeaseExpired),
		leaseEndPredecessor: r(qLeaseEndPredecessor),
		leaseClaimSuspect:   r(qLeaseClaimSuspect),
		leasePublish:        r(leasePublish),
		leaseRecord:         r(qLeaseRecord),
		leaseRelease:        r(qLeaseRelease),
		notifyChannel:       r(notifyChannel),
	}
}

// qBeginClaim opens the claim transaction in one round trip. The relay holds
// it across the dispatch, so the server must end it if the relay vanishes
// without closing its connection (a partition, a frozen VM): the idle
// timeout, set to the lease, aborts the transaction and releases its row
// locks to other relays. application_name shows the relay id in
// pg_stat_activity while the batch is in flight (the runbook's "batches in
// flight").
//
// The enable_* settings pin the plans. Every statement of the relay has one
// right plan: index scans in id order, a nested-loop probe per candidate,
// TID scans. A queue table's statistics are always wrong, though: between
// two autovacuums the live row count swings from millions to none, and B2
// caught the planner answering with sorts and hash joins over the whole
// table, which made each claim take seconds for a minute after vacuum
// resumed. Disabled paths cost so much that JIT compilation would kick in
// (about 170 ms per statement), hence jit = off. SET takes no bind
// parameters: %d is the lease in milliseconds, %s the relay id quoted as a
// literal.
const qBeginClaim = `BEGIN;
SET LOCAL idle_in_transaction_session_timeout = %d;
SET LOCAL application_name = %s;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_sort = off;
SET LOCAL enable_hashjoin = off;
SET LOCAL enable_mergejoin = off;
SET LOCAL jit = off`

// qClaim locks up to $2 claimable rows after the cursor $1 and returns them.
// It runs in the claim transaction: the row locks are the lease, held while
// the relay dispatches and released by the same transaction's commit, which
// also records the outcome. A relay that dies loses its connection, its
// transaction aborts and the rows are claimable again at once (F1); nothing
// was written for them, so nothing needs undoing.
//
// Why it is shaped this way:
//   - "id > $1" (keyset) descends outbox_pending_idx straight to the cursor.
//     Ordering by id from the start of the index (the plain SKIP LOCKED claim of docs/performance.md)
//     walks every dead entry left by recently published rows until vacuum
//     removes them; that claim decays from ~15k to ~3k rows/s on a backlog
//     (docs/adr/0002-outbox-polling-vs-cdc.md). The relay runs the same query
//     with $1 = 0 on every sweep and rewinds $1 on NOTIFY, because an id
//     behind the cursor can still appear: ids are assigned at insert but
//     become visible at commit, out of id order (watermill issue #311).
//   - FOR UPDATE SKIP LOCKED lets any number of relays claim disjoint rows
//     without waiting on each other: a row another relay holds is skipped,
//     and one it has already published is gone when re-checked.
//   - The NOT EXISTS guard keeps per-aggregate order across replicas: a row
//     is not claimed while an earlier row of its aggregate is still in the
//     outbox (pending, in another relay's batch, waiting for a retry, or
//     FAILED) unless that earlier row is in this very batch, in which case the
//     relay dispatches both, in id order. The probe uses outbox_aggregate_idx.
//     Blocked rows stay locked until this transaction ends; the next claim or
//     sweep takes them.
//   - attempts + 1 is the number of this attempt; it is recorded by the
//     statement that settles the row.
//   - Every candidate comes back, blocked ones flagged: the relay moves its
//     cursor past all of them and knows whether the batch was full, without
//     a second statement or a summary row.
//   - $4 lists the event types whose dependency's circuit is open: their
//     rows stay unclaimed, unwritten and uncharged until it closes (see
//     circuit.go). Normally empty, which costs nothing; during an outage the
//     scan steps over those rows as it steps over rows in backoff.
//   - ctid is the row's physical address, stable while this transaction
//     holds the row lock; the statements that record the outcome address
//     the rows by it (see qMarkPublished).
const qClaim = `
WITH candidates AS (
    SELECT ctid, id, event_id, aggregate_type, aggregate_id, event_type, schema_version,
           payload, headers, occurred_at, attempts
    FROM {schema}.outbox
    WHERE status = 'PENDING'
      AND id > $1
      AND (next_attempt_at IS NULL OR next_attempt_at <= $3)
      AND event_type <> ALL($4::text[])
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
SELECT c.ctid, c.id, c.event_id, c.aggregate_type, c.aggregate_id, c.event_type, c.schema_version,
       c.payload, c.headers, c.occurred_at, c.attempts + 1,
       NOT EXISTS (
           SELECT 1 FROM {schema}.outbox e
           WHERE e.aggregate_id = c.aggregate_id
             AND e.id < c.id
             AND e.id NOT IN (SELECT id FROM candidates)) AS claimable
FROM candidates c
ORDER BY c.id`

// qMarkPublished moves dispatched rows to outbox_published in one statement
// of the claim transaction. The rows are locked by that transaction, so no
// other relay can have moved or changed them: no fencing token is needed.
// A DELETE leaves no new version in the hot table and no index entry to
// maintain there; the history insert is append-only.
//
// The rows are addressed by ctid (a TID scan), not by id: a queue table's
// statistics swing from millions of live rows to none between two
// autovacuums, and with them the planner's choice for "id = ANY($1)"; B2
// caught this statement taking seconds per batch right after an autovacuum.
// A TID scan has no plan to get wrong.
//
// Every row given is locked by the claim, so each must move; a shortfall
// means the schema or the lock discipline is broken, and the batch must not
// commit. The statement goes out in one batch with the COMMIT, which runs
// before the relay reads any result, so the check is made here: %s is
// pgdb.AssertSQL's failure of the statement (newQueries), and the server
// skips the rest of the batch, COMMIT included.
const qMarkPublished = `
WITH moved AS (
    DELETE FROM {schema}.outbox
    WHERE ctid = ANY($1::tid[]) AND status = 'PENDING'
    RETURNING event_id, id, aggregate_type, aggregate_id, event_type, schema_version,
              payload, headers, attempts, last_error, occurred_at, created_at
), published AS (
    INSERT INTO {schema}.outbox_published (event_id, id, aggregate_type, aggregate_id, event_type, schema_version,
                                  payload, headers, attempts, last_error, occurred_at, created_at, published_at)
    SELECT event_id, id, aggregate_type, aggregate_id, event_type, schema_version,
           payload, headers, attempts + 1, last_error, occurred_at, created_at, $2
    FROM moved
    RETURNING 1
)
SELECT %s FROM published`

// qMarkUnpublished records the failed dispatches of a batch in one
// statement: back to PENDING with a retry time (transient failure), or to
// FAILED (permanent, unknown type, attempts exhausted). Rows that were
// claimed but not dispatched (blocked behind a failed event of their
// aggregate, cut off by shutdown) are not written at all: the commit
// releases their locks and they are claimable as they were.
const qMarkUnpublished = `
UPDATE {schema}.outbox o
SET status = u.status,
    attempts = o.attempts + 1,
    last_error = u.err,
    next_attempt_at = u.next_attempt_at
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::timestamptz[])
     AS u(id, status, err, next_attempt_at)
WHERE o.ctid = ANY($5::tid[]) AND o.id = u.id AND o.status = 'PENDING'`

// qCleanup deletes one bounded batch of published rows older than the
// retention, found through the BRIN index on published_at (no ORDER BY: any
// expired rows will do, and sorting would read them all). Undelivered rows
// are in the outbox table and never match.
const qCleanup = `
DELETE FROM {schema}.outbox_published
WHERE event_id IN (
    SELECT event_id FROM {schema}.outbox_published
    WHERE published_at < $1
    LIMIT $2)`

// qStats reads the gauges with bounded cost: the counts read at most $1 rows
// of the outbox (every row in it is undelivered; a huge backlog reports the
// cap, and the age is the signal that matters then), and the oldest pending
// row is the first entry of outbox_pending_idx.
const qStats = `
SELECT
    count(*) FILTER (WHERE status = 'PENDING') AS pending,
    count(*) FILTER (WHERE status = 'FAILED') AS failed,
    (SELECT created_at FROM {schema}.outbox WHERE status = 'PENDING' ORDER BY id LIMIT 1) AS oldest_created_at
FROM (SELECT status FROM {schema}.outbox LIMIT $1) undelivered`

// qLeaseClaim claims up to $3 rows of the slow types $1 (WithSlowDispatch,
// lease.go) by writing a lease, in a transaction of its own that commits
// before anything is dispatched: the dispatch then holds no lock and no
// transaction. It runs in a qBeginClaim transaction, so its plan is pinned
// like qClaim's.
//
// Why it is shaped this way:
//   - No keyset cursor: it reads outbox_pending_idx from its start. Slow
//     types go out at tens to hundreds of events per second and a claim
//     runs when a worker is free, so the walk over the dead prefix is short
//     next to the dispatch it feeds; it also finds every retry-due and
//     released row without a sweep.
//   - Leased rows are skipped, expired leases too: those are suspects,
//     claimed one at a time by qLeaseClaimSuspect.
//   - The NOT EXISTS guard keeps per-aggregate order: a row is not claimed
//     while any earlier row of its aggregate is in the outbox, leased or
//     not. Unlike qClaim there is no same-batch exception: events of one
//     aggregate are dispatched one at a time, each after the previous one
//     was settled.
//   - FOR UPDATE SKIP LOCKED keeps two relays' concurrent claims disjoint:
//     the second skips rows the first is leasing and re-checks the lease of
//     rows it committed meanwhile.
//   - $4 is the claim's token (the relay id and a sequence number): every
//     settlement is fenced on it, so a relay whose lease expired and was
//     taken over cannot record anything for the row.
const qLeaseClaim = `
WITH candidates AS (
    SELECT ctid
    FROM {schema}.outbox o
    WHERE status = 'PENDING'
      AND event_type = ANY($1::text[])
      AND (next_attempt_at IS NULL OR next_attempt_at <= $2)
      AND lease_until IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.outbox e
          WHERE e.aggregate_id = o.aggregate_id AND e.id < o.id)
    ORDER BY id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox o
SET lease_owner = $4, lease_until = $5, lease_alone = false
FROM candidates c
WHERE o.ctid = c.ctid
RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.schema_version,
          o.payload, o.headers, o.occurred_at, o.attempts + 1, false`

// qLeaseExpired tells whether a lease of the slow types $1 has expired
// (suspects wait). outbox_lease_idx holds only leased rows: the probe costs
// nothing however large the backlog.
const qLeaseExpired = `
SELECT EXISTS (
    SELECT 1 FROM {schema}.outbox
    WHERE lease_until <= $2 AND status = 'PENDING' AND event_type = ANY($1::text[]))`

// qLeaseEndPredecessor ends, at $3, the live leases of the slow types $1
// whose token starts with $2, this relay's id and "/": a relay runs them
// once at its start, so any such lease was taken by an earlier process with
// the same id, the same instance restarted, and nobody will settle it. They
// become suspects at once instead of when their lease runs out. A prefix
// comparison, not LIKE: an id may hold % or _.
const qLeaseEndPredecessor = `
UPDATE {schema}.outbox SET lease_until = $3
WHERE lease_until > $3 AND status = 'PENDING' AND event_type = ANY($1::text[])
  AND left(lease_owner, length($2)) = $2`

// qLeaseClaimSuspect claims one row whose lease has expired: its relay died
// or overran the lease mid-dispatch. The dispatch journal's reasoning
// (journal.go) applies to the lease: an expired lease taken while other
// events were in flight in the same process cannot be blamed on this event
// and charges nothing; one taken "alone" (lease_alone, nothing else in
// flight in that process) names the event whose dispatch died, and charges
// it an attempt; the attempt that reaches $5 (MaxAttempts) moves it to
// FAILED with $6 as the reason instead of leasing it again. Every suspect is
// leased alone, and the relay dispatches it with nothing else in flight.
const qLeaseClaimSuspect = `
WITH candidate AS (
    SELECT ctid, lease_alone
    FROM {schema}.outbox
    WHERE lease_until <= $2 AND status = 'PENDING' AND event_type = ANY($1::text[])
    ORDER BY lease_until
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox o
SET attempts    = o.attempts + c.lease_alone::int,
    status      = CASE WHEN c.lease_alone AND o.attempts + 1 >= $5 THEN 'FAILED' ELSE 'PENDING' END,
    last_error  = CASE WHEN c.lease_alone THEN $6 ELSE o.last_error END,
    lease_owner = CASE WHEN c.lease_alone AND o.attempts + 1 >= $5 THEN NULL ELSE $3 END,
    lease_until = CASE WHEN c.lease_alone AND o.attempts + 1 >= $5 THEN NULL ELSE $4::timestamptz END,
    lease_alone = NOT (c.lease_alone AND o.attempts + 1 >= $5)
FROM candidate c
WHERE o.ctid = c.ctid
RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, o.schema_version,
          o.payload, o.headers, o.occurred_at, o.attempts + 1, o.status = 'FAILED'`

// qLeasePublish moves one leased event to outbox_published, fenced on the
// claim's token $2: a relay whose lease was taken over moves nothing. The
// event's Commit runs in the same transaction. Addressed by the primary
// key, one row.
//
// It goes out in one batch with the transaction's BEGIN and the Commit's
// first statements, which the server runs before the relay reads any
// result: a lost lease must therefore fail the statement in the server, so
// that the server skips the rest of the batch and nothing of the Commit is
// committed. As in qMarkPublished, %s is pgdb.AssertSQL's failure
// (newQueries); the relay recognises its message (leaseLostMessage) and
// reports the lease lost.
const qLeasePublish = `
WITH moved AS (
    DELETE FROM {schema}.outbox
    WHERE event_id = $1 AND lease_owner = $2
    RETURNING event_id, id, aggregate_type, aggregate_id, event_type, schema_version,
              payload, headers, attempts, last_error, occurred_at, created_at
), published AS (
    INSERT INTO {schema}.outbox_published (event_id, id, aggregate_type, aggregate_id, event_type, schema_version,
                                  payload, headers, attempts, last_error, occurred_at, created_at, published_at)
    SELECT event_id, id, aggregate_type, aggregate_id, event_type, schema_version,
           payload, headers, attempts + 1, last_error, occurred_at, created_at, $3
    FROM moved
    RETURNING 1
)
SELECT %s FROM published`

// qLeaseRecord records a leased event's failed dispatch and ends its lease:
// PENDING with a retry time (transient) or FAILED, as qMarkUnpublished does
// for the lock claim. Fenced on the claim's token $2.
const qLeaseRecord = `
UPDATE {schema}.outbox
SET status = $3, attempts = attempts + 1, last_error = $4, next_attempt_at = $5,
    lease_owner = NULL, lease_until = NULL, lease_alone = false
WHERE event_id = $1 AND lease_owner = $2`

// qLeaseRelease ends the lease of an event that was not dispatched or whose
// dependency was unavailable: no attempt is charged, and a later claim
// finds no expired lease. Fenced on the claim's token $2.
const qLeaseRelease = `
UPDATE {schema}.outbox SET lease_owner = NULL, lease_until = NULL, lease_alone = false
WHERE event_id = $1 AND lease_owner = $2`

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings,
// the default since PostgreSQL 9.1), for the one SET that takes no parameters.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
