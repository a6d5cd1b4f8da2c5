package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// claimTx is the lock claim's transaction (ProcessBatch). It is a pgx.Tx
// whose BEGIN is not a round trip of its own: it goes out in the claim's
// batch (qBeginClaim's statements, then qClaim), and its COMMIT goes out in
// the batch that settles it (commitWith). pgx's own transaction sends each
// alone; at a database's distance that is two round trips of every batch
// (ADR 0002, revision 5). Like pgx's, it is used by one goroutine at a time
// and is valid until Commit or Rollback.
//
// A settlement of a lease (lease.go) uses it too, with its BEGIN, settings
// and fence in pending: they go out with the transaction's first send.
type claimTx struct {
	conn       *pgx.Conn
	savepoints int64 // savepoints named so far (sp_1, sp_2...), as pgx names them
	closed     bool
	// pending statements go out with the next batch sent through the
	// transaction (SendBatch, an Exec with arguments, commitWith) or alone
	// before any other statement. Nothing of a transaction whose pending
	// holds its BEGIN has reached the server until they are sent.
	pending []*pgx.QueuedQuery
}

// withPending returns b with the pending statements first, and forgets
// them: they are sent with b. The caller's batch is not changed.
func (tx *claimTx) withPending(b *pgx.Batch) *pgx.Batch {
	if len(tx.pending) == 0 {
		return b
	}
	pb := &pgx.Batch{QueuedQueries: append(tx.pending, b.QueuedQueries...)}
	tx.pending = nil
	return pb
}

// flush sends the pending statements alone, before a statement that cannot
// share their round trip.
func (tx *claimTx) flush(ctx context.Context) error {
	if len(tx.pending) == 0 {
		return nil
	}
	return tx.conn.SendBatch(ctx, tx.withPending(&pgx.Batch{})).Close()
}

var _ pgx.Tx = (*claimTx)(nil)

// Begin starts a pseudo nested transaction: a savepoint, sent now.
func (tx *claimTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	sp := tx.savepoint()
	if err := sp.establish(ctx); err != nil { // after the pending statements
		return nil, err
	}
	return sp, nil
}

// savepoint names the next savepoint without sending it: the returned
// transaction sends it with its first statement (savepointTx).
func (tx *claimTx) savepoint() *savepointTx {
	tx.savepoints++
	return &savepointTx{tx: tx, name: "sp_" + strconv.FormatInt(tx.savepoints, 10)}
}

// Commit commits alone, for a claim with nothing to settle.
func (tx *claimTx) Commit(ctx context.Context) error {
	return tx.commitWith(ctx, &pgx.Batch{})
}

// commitWith sends b's statements and COMMIT in one batch. A failing
// statement makes the server skip the rest of the batch, COMMIT included:
// the transaction is then left open and aborted, for Rollback or a
// ROLLBACK TO SAVEPOINT. A statement whose outcome must stop the commit
// must therefore fail in the server, not in a callback of b (those run
// after the batch, COMMIT included, has run).
func (tx *claimTx) commitWith(ctx context.Context, b *pgx.Batch) error {
	if tx.closed {
		return pgx.ErrTxClosed
	}
	b.Queue("commit").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return pgx.ErrTxCommitRollback
		}
		return nil
	})
	err := tx.conn.SendBatch(ctx, tx.withPending(b)).Close()
	if tx.conn.IsClosed() || tx.conn.PgConn().TxStatus() == 'I' {
		tx.closed = true
	}
	return err
}

// Rollback rolls the transaction back; after Commit it returns
// pgx.ErrTxClosed and sends nothing, and so does one whose BEGIN is still
// pending (nothing was sent). If the rollback fails the connection is
// closed, which ends the transaction just as well.
func (tx *claimTx) Rollback(ctx context.Context) error {
	if tx.closed {
		return pgx.ErrTxClosed
	}
	if len(tx.pending) > 0 {
		tx.pending, tx.closed = nil, true
		return nil
	}
	_, err := tx.conn.Exec(ctx, "rollback")
	tx.closed = true
	if err != nil {
		_ = tx.conn.Close(ctx)
	}
	return err
}

func (tx *claimTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := tx.flush(ctx); err != nil {
		return 0, err
	}
	return tx.conn.CopyFrom(ctx, table, columns, src)
}

func (tx *claimTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return tx.conn.SendBatch(ctx, tx.withPending(b))
}

// LargeObjects is not available in a claim transaction: pgx builds its
// LargeObjects only on its own transactions, and no Commit needs them.
func (tx *claimTx) LargeObjects() pgx.LargeObjects {
	panic("outbox: large objects are not available in the relay's claim transaction")
}

func (tx *claimTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return tx.conn.Prepare(ctx, name, sql)
}

// Exec sends sql with the pending statements when it can share their batch
// (see savepointTx.Exec), after them otherwise.
func (tx *claimTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if len(tx.pending) > 0 && batchable(args) {
		return execBatched(ctx, tx.conn, tx.withPending, sql, args)
	}
	if err := tx.flush(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.conn.Exec(ctx, sql, args...)
}

func (tx *claimTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := tx.flush(ctx); err != nil {
		return nil, err
	}
	return tx.conn.Query(ctx, sql, args...)
}

func (tx *claimTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := tx.flush(ctx); err != nil {
		return errRow{err}
	}
	return tx.conn.QueryRow(ctx, sql, args...)
}

// batchable tells whether a statement with args can go out in a batch: an
// Exec without arguments may hold several statements, which only the simple
// protocol takes, and one with a QueryExecMode asks for a protocol of its
// own.
func batchable(args []any) bool {
	if len(args) == 0 {
		return false
	}
	_, mode := args[0].(pgx.QueryExecMode)
	return !mode
}

// execBatched sends sql in a batch of its own, which with adds to.
func execBatched(ctx context.Context, conn *pgx.Conn, with func(*pgx.Batch) *pgx.Batch, sql string, args []any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	b := &pgx.Batch{}
	b.Queue(sql, args...).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	err := conn.SendBatch(ctx, with(b)).Close()
	return tag, err
}

func (tx *claimTx) Conn() *pgx.Conn { return tx.conn }

// savepointTx is a savepoint of a claimTx, the transaction the batch's
// Commits run in. Its SAVEPOINT goes out with its first statement sent by
// SendBatch or by Exec with arguments (the hand-off's first is a batch), and
// alone before any other first statement (an Exec without arguments may
// hold several statements, which only the simple protocol takes). Commit
// releases it, Rollback rolls back to it; the claim's COMMIT releases one
// that neither ended.
type savepointTx struct {
	tx          *claimTx
	name        string
	established bool // the server has it
	closed      bool
}

var _ pgx.Tx = (*savepointTx)(nil)

func (s *savepointTx) establish(ctx context.Context) error {
	if s.established {
		return nil
	}
	if err := s.tx.flush(ctx); err != nil {
		return err
	}
	if _, err := s.tx.conn.Exec(ctx, "savepoint "+s.name); err != nil {
		return err
	}
	s.established = true
	return nil
}

// withSavepoint returns b with the SAVEPOINT first if it is still to be
// sent (after its transaction's pending statements). The caller's batch is
// not changed.
func (s *savepointTx) withSavepoint(b *pgx.Batch) *pgx.Batch {
	if s.established {
		return s.tx.withPending(b)
	}
	sb := &pgx.Batch{}
	sb.Queue("savepoint " + s.name).Exec(func(pgconn.CommandTag) error {
		s.established = true
		return nil
	})
	sb.QueuedQueries = append(sb.QueuedQueries, b.QueuedQueries...)
	return s.tx.withPending(sb)
}

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	if err := s.establish(ctx); err != nil {
		return nil, err
	}
	return s.tx.Begin(ctx)
}

func (s *savepointTx) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	if !s.established {
		return nil
	}
	_, err := s.tx.conn.Exec(ctx, "release savepoint "+s.name)
	return err
}

// Rollback undoes what was sent since the savepoint. One never sent has
// nothing to undo.
func (s *savepointTx) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	if !s.established {
		return nil
	}
	_, err := s.tx.conn.Exec(ctx, "rollback to savepoint "+s.name)
	return err
}

func (s *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := s.establish(ctx); err != nil {
		return 0, err
	}
	return s.tx.conn.CopyFrom(ctx, table, columns, src)
}

func (s *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return s.tx.conn.SendBatch(ctx, s.withSavepoint(b))
}

// LargeObjects: see claimTx.LargeObjects.
func (s *savepointTx) LargeObjects() pgx.LargeObjects { return s.tx.LargeObjects() }

func (s *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return s.tx.conn.Prepare(ctx, name, sql) // names a statement; no need of the savepoint
}

func (s *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if s.established || !batchable(args) {
		if err := s.establish(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return s.tx.conn.Exec(ctx, sql, args...)
	}
	return execBatched(ctx, s.tx.conn, s.withSavepoint, sql, args)
}

func (s *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := s.establish(ctx); err != nil {
		return nil, err
	}
	return s.tx.conn.Query(ctx, sql, args...)
}

// errRow is the Row of a QueryRow whose savepoint could not be sent.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func (s *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := s.establish(ctx); err != nil {
		return errRow{err}
	}
	return s.tx.conn.QueryRow(ctx, sql, args...)
}

func (s *savepointTx) Conn() *pgx.Conn { return s.tx.conn }

// The lease path's transactions (lease.go): opened like the lock claim's,
// with BEGIN and the settings pending, so that they ride the first batch.

// leaseLostMessage is qLeasePublish's failure when the lease was lost.
const leaseLostMessage = "outbox lease lost"

// publishLeased moves row to outbox_published and runs commit (nil: none)
// in one transaction. It returns errLeaseLost when the fence failed, a
// *commitError when commit did.
func (r *Relay) publishLeased(ctx context.Context, row leasedRow, commit Commit, now time.Time) error {
	c, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	tx := r.pendingTx(c.Conn())
	defer func() { // a no-op after the commit
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer rcancel()
		_ = tx.Rollback(rctx)
	}()
	tx.pending = append(tx.pending, &pgx.QueuedQuery{SQL: r.q.leasePublish, Arguments: []any{row.ev.ID, row.token, now}})
	if commit != nil {
		if err := commit(ctx, tx); err != nil {
			if leaseLost(err) {
				return errLeaseLost
			}
			return &commitError{err: fmt.Errorf("commit of event %s: %w", row.ev.ID, err)}
		}
	}
	if err := tx.commitWith(ctx, &pgx.Batch{}); err != nil {
		if leaseLost(err) {
			return errLeaseLost
		}
		return err
	}
	return nil
}

// leaseLost tells whether err is qLeasePublish's failure on a lost lease
// (invalid_text_representation, from the cast, with its message), an error
// of a batch, wrapped or not by the Commit that sent it.
func leaseLost(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "22P02" && strings.Contains(pe.Message, leaseLostMessage)
}

type commitError struct{ err error }

func (e *commitError) Error() string { return e.err.Error() }

// pendingTx returns a transaction on conn opened like the lock claim's
// (plans pinned, application_name the relay id, bounded idle time) whose
// BEGIN and settings go out with its first statements: nothing is sent yet.
func (r *Relay) pendingTx(conn *pgx.Conn) *claimTx {
	tx := &claimTx{conn: conn}
	for _, q := range r.beginStmts {
		tx.pending = append(tx.pending, &pgx.QueuedQuery{SQL: q})
	}
	return tx
}

// oneTrip runs the statements queue adds to a batch in a transaction opened
// like the lock claim's, in one round trip: BEGIN, the settings, the
// statements and COMMIT in one batch. Nothing outside the database happens
// inside it, and no result can stop its commit: a failing statement can
// (the server skips the rest of the batch, COMMIT included).
func (r *Relay) oneTrip(ctx context.Context, queue func(*pgx.Batch)) error {
	c, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	tx := r.pendingTx(c.Conn())
	b := &pgx.Batch{}
	queue(b)
	if err = tx.commitWith(ctx, b); err != nil && !tx.closed {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer rcancel()
		_ = tx.Rollback(rctx)
	}
	return err
}
