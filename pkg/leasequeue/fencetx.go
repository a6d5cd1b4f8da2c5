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
// Its round trips: BEGIN with the fenced done mark (one batch), the effects'
// statements, COMMIT with the wake-ups (one batch). The effects still run
// only once the done mark has told which claims hold their job, and in the
// same transaction: the fence rides it as before.
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
	tx, isHeld, err := q.beginComplete(ctx, conn.Conn(), ids, epochs)
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
	// Flush queues the wake-ups (sorted, duplicates dropped) behind the
	// COMMIT instead of sending them: the server runs them once the commit
	// is done, and skips them if it fails.
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
	q.countCompleted(ctx, cs, errs, len(isHeld))
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
