package pgdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// rollbackTimeout bounds a rollback sent after the caller's context ended.
const rollbackTimeout = 5 * time.Second

// qNotify sends a committed transaction's wake-ups right after its COMMIT,
// in the same round trip. PostgreSQL serialises every committing
// transaction that has sent a NOTIFY, across all databases of the server:
// from just before its commit record until the end of the commit it holds
// one global lock, so that notifications are queued in commit order. With
// fsync on, that hold includes the WAL flush, so notifying transactions
// commit one at a time and group commit cannot batch them (ADR 0002,
// revision 4). The wake-ups therefore stay outside the business
// transaction: in the pipeline COMMIT, qNotify the server ends the
// transaction (its WAL flushed) before it reads qNotify, which runs in an
// implicit transaction of its own. set_config(..., true) turns
// synchronous_commit off for that one (a wake-up needs no durability), so
// the lock is held for microseconds instead of a flush.
const qNotify = `
SELECT set_config('synchronous_commit', 'off', true), pg_notify(n.channel, n.payload)
  FROM unnest($1::text[], $2::text[]) AS n(channel, payload)`

// qNotifyInTx is qNotify inside a transaction begun elsewhere (a pgx.Tx),
// whose commit pgdb cannot see: delivered at that commit, under the global
// lock for its whole flush.
const qNotifyInTx = `
SELECT pg_notify(n.channel, n.payload) FROM unnest($1::text[], $2::text[]) AS n(channel, payload)`

// Tx is a transaction whose BEGIN and COMMIT ride with its statements:
// Begin sends nothing, the BEGIN goes out in one batch with the first
// statement sent (SendBatch, an Exec or QueryRow with arguments), and the
// COMMIT in one batch with the statements queued last (Queue, CommitWith)
// and the wake-ups its writes announced (Notify). pgx's own transaction
// sends BEGIN and COMMIT alone: at a database's distance, two round trips of
// every transaction (ADR 0023). A transaction of one read and one write
// costs two round trips; one that needs no result before its commit costs
// one.
//
// A statement that fails makes the server skip the rest of its batch,
// COMMIT included: a statement whose outcome must stop the commit must fail
// in the server, not in a callback of the batch (those run after the
// batch, COMMIT included, has run). See AssertSQL.
//
// Begin on a Tx is a savepoint (a nested Tx), whose SAVEPOINT also rides
// with its first statement; Commit releases it, Rollback rolls back to it
// and drops what was queued and announced in it. A Tx implements pgx.Tx, so
// a store that takes a pgx.Tx or a DB runs in it unchanged. Like pgx's, it
// is used by one goroutine at a time and is valid until Commit or Rollback.
type Tx struct {
	root   *Tx              // the transaction; nil on the transaction itself
	parent *Tx              // a savepoint's enclosing savepoint; nil: the transaction
	name   string           // the savepoint's name
	spq    *pgx.QueuedQuery // a savepoint's SAVEPOINT, once queued (entered)
	closed bool

	// A savepoint's marks: the wake-ups and after-commit actions queued
	// before it began, kept when it rolls back.
	notesMark, afterMark int

	// Fields of the transaction (root == nil) alone.
	conn       *pgx.Conn
	release    func() // gives the connection back to its pool; nil if not ours
	foreign    bool   // inside a pgx.Tx begun elsewhere: the Tx is a savepoint of it
	pending    []*pgx.QueuedQuery
	begun      bool // the BEGIN (a foreign Tx's SAVEPOINT) was sent
	savepoints int64
	notes      []note
	after      []func(context.Context)
	logger     *slog.Logger
	wakeErr    error
}

type note struct{ channel, payload string }

var _ pgx.Tx = (*Tx)(nil)

// Begin returns a transaction on db; nothing is sent until its first
// statement. On a pool (Acquirer) the transaction holds one of its
// connections until Commit or Rollback; on a *pgx.Conn it runs on it; on a
// Tx it is a savepoint of it; on any other pgx.Tx it is a savepoint of that
// transaction, whose wake-ups go out inside it, delivered at its commit.
// logger receives the failures of after-commit wake-ups (nil: discarded).
// End it with Commit, CommitWith or Rollback: a deferred Rollback is a no-op
// after a commit.
func Begin(ctx context.Context, db DB, logger *slog.Logger) (*Tx, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	switch h := db.(type) {
	case *Tx:
		if h.Closed() {
			return nil, pgx.ErrTxClosed
		}
		return h.Savepoint(), nil
	case Acquirer:
		c, err := h.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		tx := &Tx{conn: c.Conn(), release: c.Release, logger: logger}
		tx.pending = []*pgx.QueuedQuery{{SQL: "begin"}}
		return tx, nil
	case *pgx.Conn:
		tx := &Tx{conn: h, logger: logger}
		tx.pending = []*pgx.QueuedQuery{{SQL: "begin"}}
		return tx, nil
	case pgx.Tx:
		if h.Conn() == nil {
			return nil, fmt.Errorf("pgdb: begin on %T: it has no connection", db)
		}
		tx := &Tx{conn: h.Conn(), foreign: true, name: "pgdb_tx", logger: logger}
		tx.pending = []*pgx.QueuedQuery{{SQL: "savepoint " + tx.name}}
		return tx, nil
	}
	return nil, fmt.Errorf("pgdb: begin on %T: not a pool, a connection or a transaction", db)
}

// InTx runs fn in a transaction begun on db (Begin) and commits it, with
// the wake-ups fn announced (Notify) after the commit, in its round trip.
// An error from fn, Begin or the commit is returned as is, after a
// rollback, and nothing fn queued or announced is sent. A panic in fn
// rolls back too.
//
//	err := pgdb.InTx(ctx, pool, logger, func(tx *pgdb.Tx) error {
//		return outbox.Append(ctx, tx, ev) // announces on tx: sent after the commit
//	})
func InTx(ctx context.Context, db DB, logger *slog.Logger, fn func(tx *Tx) error) error {
	tx, err := Begin(ctx, db, logger)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op once committed
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// top is the transaction a savepoint belongs to.
func (tx *Tx) top() *Tx {
	if tx.root != nil {
		return tx.root
	}
	return tx
}

// Queue queues a statement to go out with the transaction's next batch:
// with its first statement when nothing was sent yet (after the BEGIN), or
// with the COMMIT. Its callback (QueuedQuery.Exec, Query, QueryRow) runs
// when that batch's results are read. An error of the statement is
// returned by the statement it rode with, or by the commit.
func (tx *Tx) Queue(sql string, args ...any) *pgx.QueuedQuery {
	tx.enter()
	q := &pgx.QueuedQuery{SQL: sql, Arguments: args}
	r := tx.top()
	r.pending = append(r.pending, q)
	return q
}

// Pending reports how many statements wait for the next batch (the BEGIN
// among them until the first statement was sent).
func (tx *Tx) Pending() int { return len(tx.top().pending) }

// Notify announces a wake-up to the listeners of channel (PostgreSQL
// NOTIFY), sent after the commit in its round trip (see qNotify), and only
// if the transaction commits; a savepoint that rolls back drops its own.
// Duplicates are sent once.
func (tx *Tx) Notify(channel, payload string) {
	r := tx.top()
	r.notes = append(r.notes, note{channel, payload})
}

// AfterCommit runs fn once the transaction has committed, after its
// wake-ups; never after a rollback. In a transaction begun elsewhere (a
// pgx.Tx, not a Tx), whose commit pgdb cannot see, it runs once the
// savepoint is released.
func (tx *Tx) AfterCommit(fn func(ctx context.Context)) {
	r := tx.top()
	r.after = append(r.after, fn)
}

// Closed reports whether the transaction (or savepoint) has ended.
func (tx *Tx) Closed() bool { return tx.closed || tx.top().closed }

// Conn is the connection the transaction runs on.
func (tx *Tx) Conn() *pgx.Conn { return tx.top().conn }

// Commit commits the transaction, with the statements queued last and the
// wake-ups (CommitWith), or releases the savepoint.
func (tx *Tx) Commit(ctx context.Context) error { return tx.CommitWith(ctx, nil) }

// CommitWith sends last's statements (nil: none), the queued ones, COMMIT
// and the wake-ups in one batch and, once committed, runs the after-commit
// actions and gives the connection back. A nil error means committed. A
// failing statement leaves the transaction open and aborted, for Rollback
// (or a savepoint's Rollback); a COMMIT that PostgreSQL turned into a
// ROLLBACK returns pgx.ErrTxCommitRollback. A wake-up that fails after the
// commit is logged, not returned: the listeners' polling covers it. On a
// savepoint, last is sent and the savepoint released.
func (tx *Tx) CommitWith(ctx context.Context, last *pgx.Batch) error {
	if tx.Closed() {
		return pgx.ErrTxClosed
	}
	if tx.root != nil {
		if last != nil && len(last.QueuedQueries) > 0 {
			if err := tx.SendBatch(ctx, last).Close(); err != nil {
				return err
			}
		}
		return tx.releaseSavepoint(ctx)
	}
	if last != nil {
		tx.pending = append(tx.pending, last.QueuedQueries...)
	}
	if !tx.begun && len(tx.pending) == 1 && len(tx.notes) == 0 {
		tx.end() // nothing ran: nothing to commit
		tx.runAfter(ctx)
		return nil
	}
	b := &pgx.Batch{}
	committed := false
	if tx.foreign {
		tx.queueNotes(b, qNotifyInTx)
		b.Queue("release savepoint " + tx.name).Exec(func(pgconn.CommandTag) error { committed = true; return nil })
	} else {
		b.Queue("commit").Exec(func(tag pgconn.CommandTag) error {
			if tag.String() == "ROLLBACK" {
				return pgx.ErrTxCommitRollback
			}
			committed = true
			return nil
		})
		tx.queueNotes(b, qNotify)
	}
	err := tx.SendBatch(ctx, b).Close()
	if committed {
		if err != nil {
			tx.wakeErr = err
			tx.logger.WarnContext(ctx, "notification after commit failed; listeners will find the rows by polling", "error", err)
		}
		tx.end()
		tx.runAfter(ctx)
		return nil
	}
	if err == nil {
		err = errors.New("pgdb: commit sent no result") // unreachable: COMMIT's callback runs
	}
	if tx.conn.IsClosed() || (!tx.foreign && tx.conn.PgConn().TxStatus() == 'I') {
		tx.end()
	}
	return err
}

// WakeErr is the failure of the wake-ups sent after the commit (nil: none
// failed), for a caller that reports it: the commit stands, and the
// listeners' polling finds the rows.
func (tx *Tx) WakeErr() error { return tx.top().wakeErr }

// runAfter runs the after-commit actions, once.
func (tx *Tx) runAfter(ctx context.Context) {
	after := tx.after
	tx.after = nil
	for _, fn := range after {
		fn(ctx)
	}
}

// queueNotes queues the transaction's wake-ups, sorted and without
// duplicates, in one statement q.
func (tx *Tx) queueNotes(b *pgx.Batch, q string) {
	if len(tx.notes) == 0 {
		return
	}
	slices.SortFunc(tx.notes, func(a, b note) int {
		return cmp.Or(cmp.Compare(a.channel, b.channel), cmp.Compare(a.payload, b.payload))
	})
	ns := slices.Compact(tx.notes)
	channels, payloads := make([]string, len(ns)), make([]string, len(ns))
	for i, n := range ns {
		channels[i], payloads[i] = n.channel, n.payload
	}
	b.Queue(q, channels, payloads)
}

// Rollback rolls the transaction back and gives its connection back, or
// rolls back to the savepoint; what was queued and announced in it is
// dropped. Nothing is sent when nothing was. After Commit it returns
// pgx.ErrTxClosed, so a deferred Rollback is safe. It is sent even when ctx
// has ended, within rollbackTimeout. A transaction whose rollback fails has
// its connection closed, which ends it just as well.
func (tx *Tx) Rollback(ctx context.Context) error {
	if tx.Closed() {
		return pgx.ErrTxClosed
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	r := tx.top()
	tx.closed = true
	if tx.root != nil {
		r.notes, r.after = r.notes[:min(tx.notesMark, len(r.notes))], r.after[:min(tx.afterMark, len(r.after))]
		if tx.spq == nil {
			return nil
		}
		if i := slices.Index(r.pending, tx.spq); i >= 0 {
			r.pending = r.pending[:i] // never sent: nothing to undo
			return nil
		}
		r.pending = nil // queued inside the savepoint
		_, err := r.conn.Exec(ctx, "rollback to savepoint "+tx.name)
		return err
	}
	defer r.end()
	if !r.begun {
		return nil
	}
	sql := "rollback"
	if r.foreign {
		sql = "rollback to savepoint " + r.name
	}
	_, err := r.conn.Exec(ctx, sql)
	if err != nil && !r.foreign {
		_ = r.conn.Close(ctx)
	}
	return err
}

// end closes the transaction and gives its connection back. A pooled
// connection still inside a transaction is closed by the pool, not reused.
func (tx *Tx) end() {
	tx.closed, tx.pending, tx.notes = true, nil, nil
	if tx.release != nil {
		tx.release()
		tx.release = nil
	}
}

// flush sends the queued statements alone, before a statement that cannot
// share their batch.
func (tx *Tx) flush(ctx context.Context) error {
	if len(tx.top().pending) == 0 {
		return nil
	}
	return tx.SendBatch(ctx, &pgx.Batch{}).Close()
}
