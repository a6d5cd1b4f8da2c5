// Package pgdb is how every pattern package and service talks to
// PostgreSQL: one database interface ([DB], [Executor], [Beginner]), one
// transaction ([Tx], [InTx], [Begin]) whose BEGIN and COMMIT ride with its
// statements and whose wake-ups follow its commit, pools with bounds that
// fit the workload ([Open], [New]), and one classification of errors
// ([IsData], [IsUnavailable]).
//
// Lesson: a library that takes an interface any pgx handle satisfies (a
// *pgxpool.Pool, a *pgx.Conn or a pgx.Tx) lets the caller decide the
// transaction: the same Store call joins the caller's business transaction or
// runs on its own. Guards F15 (database unavailable: bounded waits, retried,
// never parked), H8 (a flood of API requests cannot starve the workers) and
// N1 (a server that stops answering under an open connection: TCP user
// timeout and keepalive on both ends of every connection);
// IsData and IsUnavailable are the database half of invariant I5.
//
// # Database handles
//
// [Executor] runs statements; [Beginner] starts a transaction (on a pgx.Tx,
// a savepoint). [DB] is both. A pattern package fixes its schema when it is
// constructed, never per call. [Acquirer] is a pool, where a pool's own
// features are the point: a [Tx] holds one of its connections for its whole
// life so that its statements can share round trips.
//
// # Transactions
//
// A use case runs its transaction with one call, [InTx], and announces its
// wake-ups on it (Tx.Notify, or pgnotify.Notify and outbox.Append, which
// find the Tx), never through a context value:
//
//	err := pgdb.InTx(ctx, pool, logger, func(tx *pgdb.Tx) error {
//		if _, err := tx.Exec(ctx, qInsertOrder, id); err != nil {
//			return err
//		}
//		return outbox.Append(ctx, tx, ev) // wakes the relays after the commit
//	})
//
// A [Tx] spends no round trip of its own: its BEGIN goes out with its first
// statement and its COMMIT with the statements queued last (Tx.Queue,
// Tx.CommitWith), followed in the same batch by the wake-up NOTIFY, which
// runs after the COMMIT in a transaction of its own: inside the business
// transaction it would hold PostgreSQL's global NOTIFY lock across the
// commit's WAL flush, serialising every notifying commit of the server (ADR
// 0002, revision 4). A transaction of a read and a write costs two round
// trips where pgx's own costs four, and a fifth for the notification (ADR
// 0023). Tx.AfterCommit runs Go code once committed, never after a
// rollback. Begin on a Tx is a savepoint whose SAVEPOINT also rides with its
// first statement; its rollback drops what was announced in it. Begin and
// CommitWith are the parts InTx is made of, for a loop that decides between
// its BEGIN's batch and its COMMIT's (the relays, the lease queue's
// completion).
//
// A statement that shares the COMMIT's batch runs before its result is
// read: when its outcome must stop the commit, it fails in the server,
// through [AssertSQL], and [IsAssertion] recognises that failure.
//
// A component takes the narrowest of them that fits rather than declaring a
// method set of its own, so any handle passes everywhere. It takes a
// *pgxpool.Pool only where a pool's own features are the point, and says so
// where it does: a connection it acquires and holds (LISTEN, a session lock,
// a transaction pipelined on one connection), the pool's statistics, or its
// lifecycle (Config, Close).
//
// # Pools
//
// Open opens the PostgreSQL connection pools of a service with
// bounds that fit its workload: a pool size (pgxpool's own default,
// max(4, CPUs), starves a process that runs an API, several relays and a
// LISTEN connection at once), and server-side time bounds on every
// connection (statement_timeout, lock_timeout) plus a connect timeout, so a
// stuck query, a lock queue or an unreachable server cannot hold a
// connection or a caller for ever.
//
// A service opens two pools (Open): one for its API and one for its
// background workers (relays, consumers, cleanups), so a flood of API
// requests queues on the API pool and cannot take the connections the
// relays need to drain the outbox and the inbox.
//
// Their connections send and read github.com/google/uuid's UUID as
// PostgreSQL's binary uuid, 16 bytes copied; pgx alone takes it through
// its driver.Valuer and text, about 1.2 µs an id (BenchmarkEncodeUUIDs).
//
// # Connection arithmetic
//
// PostgreSQL's default max_connections is 100, 3 of them reserved for
// superusers. With the defaults the three services open at most:
//
//	workorder     API 10 + workers 12 + 2 LISTEN + 2 outbox journal = 26
//	billing       API  5 + workers 16 + 1 LISTEN + 2 outbox journal = 24
//	provider-sim  one pool of DefaultMaxConns (New)                = 20
//	                                                            total 70
//
// LISTEN connections (pkg/pgnotify, one per relay) and the outbox relay's
// dispatch journal (one per batch in flight) are opened from the workers'
// pool settings but outside the pool: a batch holds a pooled connection
// while it writes the journal, so from the pool they could starve each
// other. 70 + 3 reserved leaves 27 connections: one replica of the largest
// service during a rolling deploy (26), or a few operator sessions (psql,
// migrate, CLI commands). Running more replicas
// needs a larger max_connections or a pooler in session mode. Not a
// transaction-mode pooler: advisory session locks (pkg/pgleader, goose's
// migrate lock), the pooled LISTEN of the lease workers, the start-up
// timeouts and pgx's statement cache all need a session.
//
// # Errors
//
// IsData and IsUnavailable classify PostgreSQL and pgx errors by what the caller
// should do about them, in one place, so that every batch consumer, relay and
// API answers the same question the same way:
//
//   - [IsData]: the statement was rejected because of the data it carried (a
//     NUL byte in text, an over-long id, a CHECK or foreign key violation).
//     Retrying the same data fails the same way: isolate the row that caused
//     it and park it; its batch-mates are fine.
//   - [IsUnavailable]: the database could not be reached or could not serve
//     the request now (connection refused or lost, server shutting down or
//     starting, too many connections, a pool acquire or statement that ran out
//     of time). Retrying later is safe: nack, back off, answer UNAVAILABLE.
//
// Anything else (a syntax error, a missing table, a permission) is a bug or a
// deployment fault: neither isolating rows nor retrying fixes it.
package pgdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Executor runs statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Executor interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Beginner starts a transaction: on a pool or a connection a new one, on a
// pgx.Tx a savepoint that its Commit releases.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// DB is a handle that can do both: what a store takes when it may run inside
// the caller's transaction or on its own.
type DB interface {
	Executor
	Beginner
}

// Compile-time proof that every pgx handle is a DB.
var (
	_ DB = (pgx.Tx)(nil)
	_ DB = (*pgx.Conn)(nil)
	_ DB = (*pgxpool.Pool)(nil)
)

// Acquirer is a pool: a *pgxpool.Pool, where a pool's own feature is the
// point: Begin holds one of its connections for the whole transaction, so
// that the transaction's statements can share round trips.
type Acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

var _ Acquirer = (*pgxpool.Pool)(nil)
