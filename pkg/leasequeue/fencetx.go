package leasequeue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lossless-dev/lossless/pkg/pgnotify"
)

// completeTx runs one completion transaction; errs receives ErrLeaseLost for
// fenced-off jobs. A returned error means nothing was committed, except for a
// failed Commit, whose outcome is unknown. The notifications the effects'
// writes announce (pgnotify.Send, e.g. by outbox.Append) are sent after the
// commit, in the COMMIT's batch (fenceTx.commitWith).
//
// It first expects every claim to hold its job (a lost lease is rare):
// BEGIN and the done mark go out with the effects' first statement, the
// done mark failing in the server, before that statement runs, if a claim
// does not hold its job (completeAllHeld). Then it starts over, learning
// which claims hold and running only their effects (completeHeld). Either
// way the effects commit in the done mark's transaction, or not at all.
func (q *Queue) completeTx(ctx context.Context, cs []completion, errs []error) error {
	jobs := make([]Job, len(cs))
	for i, c := range cs {
		jobs[i] = c.job
	}
	ids, epochs := idsEpochs(jobs)
	if !slices.ContainsFunc(cs, func(c completion) bool { return c.effects != nil }) {
		return q.markDone(ctx, cs, errs, ids, epochs)
	}
	conn, err := q.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("leasequeue: complete: %w", err)
	}
	defer conn.Release() // a connection left inside a transaction is closed, not reused
	if done, err := q.completeAllHeld(ctx, conn.Conn(), cs, ids, epochs); done || err != nil {
		return err
	}
	return q.completeHeld(ctx, conn.Conn(), cs, errs, ids, epochs)
}

// completeAllHeld is completeTx's first try: done reports false, with nothing
// committed, when a claim did not hold its job (or the done mark failed
// otherwise): the caller starts over with completeHeld. Round trips: BEGIN,
// the done mark and the effects' first statement in one batch, the effects'
// other statements, COMMIT and the wake-ups in one batch.
func (q *Queue) completeAllHeld(ctx context.Context, conn *pgx.Conn, cs []completion, ids, epochs []int64) (done bool, err error) {
	tx := &fenceTx{conn: conn}
	tx.pend(q.sql.completeAll, ids, epochs, q.now())
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = tx.Rollback(rctx) // pgx.ErrTxClosed once committed
	}()
	txCtx, notes := pgnotify.Defer(ctx)
	for _, c := range cs {
		if c.effects == nil {
			continue
		}
		if err := c.effects(txCtx, tx); err != nil {
			if tx.pendingErr != nil {
				return false, nil // the effects never ran: the done mark failed first
			}
			return false, effectError{err: err}
		}
	}
	if tx.pendingErr != nil { // an effect swallowed its statement's error
		return false, nil
	}
	if err := q.commit(ctx, tx, notes); err != nil {
		if tx.pendingErr != nil {
			return false, nil
		}
		return false, err
	}
	q.countCompleted(ctx, cs, make([]error, len(cs)), len(cs))
	return true, nil
}

// completeHeld is completeTx's second try: BEGIN with qComplete, which
// returns the claims that hold their job (one batch), the effects of those
// alone, COMMIT with the wake-ups (one batch).
func (q *Queue) completeHeld(ctx context.Context, conn *pgx.Conn, cs []completion, errs []error, ids, epochs []int64) error {
	tx, isHeld, err := q.beginComplete(ctx, conn, ids, epochs)
	if err != nil {
		return fmt.Errorf("leasequeue: complete: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = tx.Rollback(rctx) // pgx.ErrTxClosed once committed
	}()
	txCtx, notes := pgnotify.Defer(ctx)
	for i, c := range cs {
		if !isHeld[claimOf(c.job)] {
			errs[i] = ErrLeaseLost
			continue
		}
		if c.effects == nil {
			continue
		}
		if err := c.effects(txCtx, tx); err != nil {
			return effectError{err: err}
		}
	}
	if err := q.commit(ctx, tx, notes); err != nil {
		return err
	}
	q.countCompleted(ctx, cs, errs, len(isHeld))
	return nil
}

// commit commits tx with the wake-ups its effects announced behind the
// COMMIT: Flush queues them (sorted, duplicates dropped) instead of sending
// them, and the server runs them once the commit is done, or skips them if
// it fails.
func (q *Queue) commit(ctx context.Context, tx *fenceTx, notes *pgnotify.Deferred) error {
	wakeups := &pgx.Batch{}
	notes.Flush(ctx, batchQueue{wakeups}, q.logger)
	br, err := tx.commitWith(ctx, wakeups)
	if err != nil {
		return fmt.Errorf("leasequeue: complete: commit: %w", err)
	}
	for range wakeups.QueuedQueries {
		if _, err := br.Exec(); err != nil {
			q.logger.WarnContext(ctx, "notification after commit failed; listeners will find the rows by polling", "error", err)
			break
		}
	}
	_ = br.Close() // the commit is done; a failed wake-up is logged above
	return nil
}

// markDone completes jobs without effects: the fenced done mark alone, one
// statement and so its own transaction, with no BEGIN or COMMIT to send.
func (q *Queue) markDone(ctx context.Context, cs []completion, errs []error, ids, epochs []int64) error {
	rows, err := q.pool.Query(ctx, q.sql.complete, ids, epochs, q.now())
	if err != nil {
		return fmt.Errorf("leasequeue: complete: %w", err)
	}
	isHeld, err := collectClaims(rows)
	if err != nil {
		return fmt.Errorf("leasequeue: complete: %w", err)
	}
	for i, c := range cs {
		if !isHeld[claimOf(c.job)] {
			errs[i] = ErrLeaseLost
		}
	}
	q.countCompleted(ctx, cs, errs, len(isHeld))
	return nil
}

// countCompleted counts a committed completion: held jobs done, the others
// fenced off.
func (q *Queue) countCompleted(ctx context.Context, cs []completion, errs []error, held int) {
	q.m.completed.Add(ctx, int64(held), q.m.attrs)
	for i, c := range cs {
		if errors.Is(errs[i], ErrLeaseLost) {
			q.m.fenced.Add(ctx, 1, q.m.attrs)
			q.logger.Warn("completion fenced off: lease lost to another claim; nothing committed",
				"job_id", c.job.ID, "stale_epoch", c.job.Epoch, "owner", c.job.Owner)
		}
	}
}

// beginComplete sends BEGIN and the fenced done mark in one batch and
// returns the open transaction and the claims that still hold their job. On
// an error nothing is left open.
func (q *Queue) beginComplete(ctx context.Context, conn *pgx.Conn, ids, epochs []int64) (*fenceTx, map[claim]bool, error) {
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue(q.sql.complete, ids, epochs, q.now())
	br := conn.SendBatch(ctx, b)
	var held map[claim]bool
	_, err := br.Exec()
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			held, err = collectClaims(rows)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	tx := &fenceTx{conn: conn}
	if err != nil {
		if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			_ = tx.Rollback(rctx)
		}
		return nil, nil, err
	}
	return tx, held, nil
}

// batchQueue is a pgnotify.Execer that queues the statement into a batch
// instead of sending it, for the batch to send later.
type batchQueue struct{ b *pgx.Batch }

func (q batchQueue) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.b.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// fenceTx is a completion's transaction (completeTx): a pgx.Tx whose BEGIN
// is not a round trip of its own but goes out in one batch with the fenced
// done mark, and whose COMMIT goes out in one batch with the wake-ups its
// effects announced. pgx's own transaction sends BEGIN and COMMIT alone; at
// a database's distance that is two round trips of every job (ADR 0006,
// revision "fewer round trips per job"). Like pgx's, it is used by one
// goroutine at a time and is valid until commitWith or Rollback.
//
// Its BEGIN may also wait, with the done mark (pend), for the effects' first
// statement: both then go out in one batch before it, and the statement
// runs only if they succeed. A failure of theirs is returned as that
// statement's and kept in pendingErr.
type fenceTx struct {
	conn       *pgx.Conn
	pending    *pgx.Batch // BEGIN and the done mark, not sent yet
	begun      bool       // BEGIN was sent
	pendingErr error      // BEGIN or the done mark failed
	savepoints int64      // savepoints named so far (sp_1, sp_2...), as pgx names them
	closed     bool
}

// pend makes BEGIN and the done mark (a statement returning one row) wait
// for the next statement sent.
func (tx *fenceTx) pend(mark string, args ...any) {
	tx.pending = &pgx.Batch{}
	tx.pending.Queue("begin")
	tx.pending.Queue(mark, args...)
}

// withPending returns b with the pending statements first, if any, and
// forgets them.
func (tx *fenceTx) withPending(b *pgx.Batch) *pgx.Batch {
	if tx.pending == nil {
		return b
	}
	p := tx.pending
	tx.pending, tx.begun = nil, true
	p.QueuedQueries = append(p.QueuedQueries, b.QueuedQueries...)
	return p
}

// readPending reads the results of BEGIN and the done mark, first in br.
func (tx *fenceTx) readPending(br pgx.BatchResults) error {
	_, err := br.Exec()
	if err == nil {
		var n int64
		err = br.QueryRow().Scan(&n)
	}
	if err != nil {
		tx.pendingErr = err
	}
	return err
}

// sendPending sends the pending statements alone, before a statement that
// cannot go in a batch with them.
func (tx *fenceTx) sendPending(ctx context.Context) error {
	if tx.pending == nil {
		return tx.pendingErr
	}
	br := tx.conn.SendBatch(ctx, tx.withPending(&pgx.Batch{}))
	err := tx.readPending(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// batchable reports whether a statement with args can be queued in a
// pgx.Batch as it would be sent alone: it has arguments (an Exec without may
// hold several statements, which only the simple protocol takes) and no
// query option in front of them.
func batchable(args []any) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID, pgx.QueryRewriter:
		return false
	}
	return true
}

var _ pgx.Tx = (*fenceTx)(nil)

// Begin starts a pseudo nested transaction: a savepoint.
func (tx *fenceTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	if err := tx.sendPending(ctx); err != nil {
		return nil, err
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
	br, err := tx.commitWith(ctx, &pgx.Batch{})
	if err != nil {
		return err
	}
	return br.Close()
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
	pending := tx.pending != nil
	br := tx.conn.SendBatch(ctx, tx.withPending(b))
	if pending {
		if err := tx.readPending(br); err != nil {
			_ = br.Close()
			return nil, err
		}
	}
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
	if !tx.begun && tx.pending != nil { // never sent: nothing to roll back
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

func (tx *fenceTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := tx.sendPending(ctx); err != nil {
		return 0, err
	}
	return tx.conn.CopyFrom(ctx, table, columns, src)
}

// SendBatch sends the pending statements alone first: the results of a
// batch carrying them would have to be read past them.
func (tx *fenceTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := tx.sendPending(ctx); err != nil {
		return errBatch{err}
	}
	return tx.conn.SendBatch(ctx, b)
}

// LargeObjects is not available in a completion's transaction: pgx builds
// its LargeObjects only on its own transactions.
func (tx *fenceTx) LargeObjects() pgx.LargeObjects {
	panic("leasequeue: large objects are not available in a completion's transaction")
}

func (tx *fenceTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return tx.conn.Prepare(ctx, name, sql) // names a statement; needs no transaction
}

func (tx *fenceTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if tx.pending == nil || !batchable(args) {
		if err := tx.sendPending(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return tx.conn.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := tx.conn.SendBatch(ctx, tx.withPending(b))
	if err := tx.readPending(br); err != nil {
		_ = br.Close()
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query sends the pending statements alone first: the rows of a batch
// carrying them would have to be closed with the batch.
func (tx *fenceTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := tx.sendPending(ctx); err != nil {
		return nil, err
	}
	return tx.conn.Query(ctx, sql, args...)
}

func (tx *fenceTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if tx.pending == nil || !batchable(args) {
		if err := tx.sendPending(ctx); err != nil {
			return errRow{err}
		}
		return tx.conn.QueryRow(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := tx.conn.SendBatch(ctx, tx.withPending(b))
	if err := tx.readPending(br); err != nil {
		_ = br.Close()
		return errRow{err}
	}
	return batchRow{row: br.QueryRow(), br: br}
}

// batchRow is the row of a statement sent in a batch: its Scan also closes
// the batch, as a Row's Scan releases its connection.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// errRow is the Row of a statement that was not sent.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errBatch is the BatchResults of a batch that was not sent.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

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
