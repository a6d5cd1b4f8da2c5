package pgdb

import (
	"context"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// A savepoint is a Tx nested in another: its SAVEPOINT rides with its first
// statement, its RELEASE with the next batch, and a savepoint that sends
// nothing costs nothing. Rolling one back drops its statements and wake-ups.

// Savepoint starts a savepoint without sending anything: its SAVEPOINT goes
// out with its first statement, and one that sends nothing costs nothing.
// Begin does the same, for pgx.Tx's sake.
func (tx *Tx) Savepoint() *Tx {
	r := tx.top()
	r.savepoints++
	sp := &Tx{root: r, name: "sp_" + strconv.FormatInt(r.savepoints, 10), notesMark: len(r.notes), afterMark: len(r.after)}
	if tx.root != nil {
		sp.parent = tx
	}
	return sp
}

// enter queues the SAVEPOINTs of tx and of its enclosing savepoints that
// are not queued yet, before tx's first statement.
func (tx *Tx) enter() {
	if tx.root == nil || tx.spq != nil {
		return
	}
	if tx.parent != nil {
		tx.parent.enter()
	}
	tx.spq = &pgx.QueuedQuery{SQL: "savepoint " + tx.name}
	tx.root.pending = append(tx.root.pending, tx.spq)
}

// Begin starts a savepoint (Savepoint), for pgx.Tx's sake.
func (tx *Tx) Begin(context.Context) (pgx.Tx, error) {
	if tx.Closed() {
		return nil, pgx.ErrTxClosed
	}
	return tx.Savepoint(), nil
}

// releaseSavepoint releases a savepoint: nothing when it never entered or when
// nothing follows its SAVEPOINT, still queued; else RELEASE, queued after
// the statements still waiting, or sent now.
func (tx *Tx) releaseSavepoint(ctx context.Context) error {
	tx.closed = true
	if tx.spq == nil {
		return nil
	}
	r := tx.root
	switch i := slices.Index(r.pending, tx.spq); {
	case i >= 0 && i == len(r.pending)-1:
		r.pending = r.pending[:i]
		return nil
	case i >= 0:
		r.pending = append(r.pending, &pgx.QueuedQuery{SQL: "release savepoint " + tx.name})
		return nil
	}
	_, err := r.conn.Exec(ctx, "release savepoint "+tx.name)
	return err
}
