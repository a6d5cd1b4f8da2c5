package leasequeue

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// fenceTx is a completion's transaction (completeTx): a pgx.Tx whose BEGIN
// is not a round trip of its own but goes out in one batch with the fenced
// done mark, and whose COMMIT goes out in one batch with the wake-ups its
// effects announced. pgx's own transaction sends BEGIN and COMMIT alone; at
// a database's distance that is two round trips of every job (ADR 0006,
// revision "fewer round trips per job"). Like pgx's, it is used by one
// goroutine at a time and is valid until commitWith or Rollback.
type fenceTx struct {
	conn       *pgx.Conn
	savepoints int64 // savepoints named so far (sp_1, sp_2...), as pgx names them
	closed     bool
}

var _ pgx.Tx = (*fenceTx)(nil)

// Begin starts a pseudo nested transaction: a savepoint.
func (tx *fenceTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	tx.savepoints++
	sp := &savepointTx{tx: tx, name: "sp_" + strconv.FormatInt(tx.savepoints, 10)}
	if _, err := tx.conn.Exec(ctx, "savepoint "+sp.name); err != nil {
		return nil, err
	}
	return sp, nil
}

// Commit commits alone. completeTx commits with commitWith; Commit is for a
// Complete that would end the transaction itself (none should).
func (tx *fenceTx) Commit(ctx context.Context) error {
	_, err := tx.commitWith(ctx, &pgx.Batch{})
	return err
}

// commitWith sends COMMIT and then after's statements in one batch. after's
// statements run once the commit is done, in an implicit transaction of
// their own that ends at the batch's end (the wake-ups, whose own commit is
// not durable, must not share the business commit: pgnotify). A failed
// COMMIT makes the server skip them. It returns the batch's results past the
// COMMIT, for the caller to read and close, and COMMIT's error; on an error
// the results are closed already.
func (tx *fenceTx) commitWith(ctx context.Context, after *pgx.Batch) (pgx.BatchResults, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	b := &pgx.Batch{}
	b.Queue("commit")
	b.QueuedQueries = append(b.QueuedQueries, after.QueuedQueries...)
	br := tx.conn.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	if err != nil {
		_ = br.Close() // reads up to the batch's end: TxStatus is current
		if tx.conn.IsClosed() || tx.conn.PgConn().TxStatus() == 'I' {
			tx.closed = true
		}
		return nil, err
	}
	// Committed. (TxStatus is not current before the batch's end is read.)
	tx.closed = true
	return br, nil
}

// Rollback rolls the transaction back; after a commit it returns
// pgx.ErrTxClosed and sends nothing. If the rollback fails the connection is
// closed, which ends the transaction just as well.
func (tx *fenceTx) Rollback(ctx context.Context) error {
	if tx.closed {
		return pgx.ErrTxClosed
	}
	_, err := tx.conn.Exec(ctx, "rollback")
	tx.closed = true
	if err != nil {
		_ = tx.conn.Close(ctx)
	}
	return err
}

func (tx *fenceTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return tx.conn.CopyFrom(ctx, table, columns, src)
}

func (tx *fenceTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return tx.conn.SendBatch(ctx, b)
}

// LargeObjects is not available in a completion's transaction: pgx builds
// its LargeObjects only on its own transactions.
func (tx *fenceTx) LargeObjects() pgx.LargeObjects {
	panic("leasequeue: large objects are not available in a completion's transaction")
}

func (tx *fenceTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return tx.conn.Prepare(ctx, name, sql)
}

func (tx *fenceTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return tx.conn.Exec(ctx, sql, args...)
}

func (tx *fenceTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return tx.conn.Query(ctx, sql, args...)
}

func (tx *fenceTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return tx.conn.QueryRow(ctx, sql, args...)
}

func (tx *fenceTx) Conn() *pgx.Conn { return tx.conn }

// savepointTx is a savepoint of a fenceTx, for a Complete that nests a
// transaction (pgx.BeginFunc on its tx). Commit releases it, Rollback rolls
// back to it; the completion's COMMIT releases one that neither ended.
type savepointTx struct {
	tx     *fenceTx
	name   string
	closed bool
}

var _ pgx.Tx = (*savepointTx)(nil)

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return s.tx.Begin(ctx)
}

func (s *savepointTx) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.tx.conn.Exec(ctx, "release savepoint "+s.name)
	return err
}

func (s *savepointTx) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.tx.conn.Exec(ctx, "rollback to savepoint "+s.name)
	return err
}

func (s *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return s.tx.CopyFrom(ctx, table, columns, src)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return s.tx.SendBatch(ctx, b)
}

// LargeObjects: see fenceTx.LargeObjects.
func (s *savepointTx) LargeObjects() pgx.LargeObjects { return s.tx.LargeObjects() }

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return s.tx.Prepare(ctx, name, sql)
}

func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return s.tx.Exec(ctx, sql, args...)
}

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return s.tx.Query(ctx, sql, args...)
}

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return s.tx.QueryRow(ctx, sql, args...)
}

func (s *savepointTx) Conn() *pgx.Conn { return s.tx.conn }
