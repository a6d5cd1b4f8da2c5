package pgnotify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// Pipelined is InTx for a loop that counts its round trips (ADR 0023): its
// BEGIN travels with the transaction's first statements (Begin) and its
// COMMIT with the transaction's last statements and the notifications its
// writes announced (Commit), so a transaction of one read and one write
// costs two round trips where InTx spends five (BEGIN, read, write, COMMIT,
// notification).
//
// The notification still follows the commit and stays outside the
// business transaction: in the pipeline COMMIT, ..., qSend, PostgreSQL ends
// the transaction (its WAL flushed) when it executes COMMIT, before it reads
// the next statement, which then runs in an implicit transaction of its own
// that does not wait for the flush (qSend). A statement that fails before
// COMMIT makes the server skip the rest of the pipeline: no commit, no
// notification, the transaction left to roll back.
//
// On a pool the transaction runs on a connection Begin acquires and Commit
// or Rollback releases. On any other handle Begin and Commit spend their
// own round trips (db.Begin, tx.Commit: a savepoint on a pgx.Tx) and the
// notifications go as InTx sends them.
type Pipelined struct {
	conn   *pgxpool.Conn // nil unless on a pool
	tx     pgx.Tx
	db     pgdb.DB
	notes  *Deferred // nil when db is a transaction: Send follows it
	logger *slog.Logger
	done   bool
}

// acquirer is a pool: *pgxpool.Pool.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Begin starts a transaction on db and sends first's statements in it, in
// the round trip of its BEGIN on a pool; their callbacks (QueuedQuery.Exec,
// Query, QueryRow) have run when Begin returns. first may be nil or empty.
// Run the transaction's statements with the returned context, so that the
// notifications they announce (Send) are collected for Commit, and end it
// with Commit or Rollback. On an error nothing is left open.
func Begin(ctx context.Context, db pgdb.DB, logger *slog.Logger, first *pgx.Batch) (context.Context, *Pipelined, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Pipelined{db: db, logger: logger}
	if _, nested := db.(pgx.Tx); !nested {
		ctx, p.notes = Defer(ctx)
	}
	pool, ok := db.(acquirer)
	if !ok {
		tx, err := db.Begin(ctx)
		if err != nil {
			return nil, nil, err
		}
		p.tx = tx
		if first != nil && first.Len() > 0 {
			if err := tx.SendBatch(ctx, first).Close(); err != nil {
				_ = tx.Rollback(ctx)
				return nil, nil, err
			}
		}
		return ctx, p, nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	if first != nil {
		b.QueuedQueries = append(b.QueuedQueries, first.QueuedQueries...)
	}
	br := conn.SendBatch(ctx, b)
	p.conn, p.tx = conn, br.Tx()
	if err := br.Close(); err != nil {
		p.end(ctx)
		return nil, nil, err
	}
	return ctx, p, nil
}

// Tx is the transaction, for the statements between Begin and Commit.
func (p *Pipelined) Tx() pgx.Tx { return p.tx }

// errCommitRollback is a COMMIT that PostgreSQL turned into a ROLLBACK:
// the transaction had failed, nothing was committed.
var errCommitRollback = pgx.ErrTxCommitRollback

// Commit sends last's statements, COMMIT and the collected notifications in
// one round trip on a pool, and releases the connection. A nil error means
// committed. A failure of last or of the commit rolls back and is returned;
// a failed notification after the commit is logged, not returned (the
// listeners' polling covers it, as Flush). last may be nil or empty.
func (p *Pipelined) Commit(ctx context.Context, last *pgx.Batch) error {
	if p.done {
		return pgx.ErrTxClosed
	}
	if p.conn == nil {
		return p.commitUnpipelined(ctx, last)
	}
	defer p.end(ctx)
	b := &pgx.Batch{}
	if last != nil {
		b.QueuedQueries = append(b.QueuedQueries, last.QueuedQueries...)
	}
	committed := false
	b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return errCommitRollback
		}
		committed = true
		return nil
	})
	ns := p.notes.take()
	if len(ns) > 0 {
		channels, payloads := columns(ns)
		b.Queue(qSend, channels, payloads)
	}
	err := p.tx.SendBatch(ctx, b).Close()
	switch {
	case err == nil:
		return nil
	case committed:
		p.logger.WarnContext(ctx, "notification after commit failed; listeners will find the rows by polling",
			"channels", strings.Join(slices.Compact(slices.Sorted(slices.Values(channelsOf(ns)))), ", "), "error", err)
		return nil
	}
	return err
}

// commitUnpipelined is Commit on a handle that is not a pool.
func (p *Pipelined) commitUnpipelined(ctx context.Context, last *pgx.Batch) error {
	p.done = true
	if last != nil && last.Len() > 0 {
		if err := p.tx.SendBatch(ctx, last).Close(); err != nil {
			_ = p.tx.Rollback(ctx)
			return err
		}
	}
	if err := p.tx.Commit(ctx); err != nil {
		return err
	}
	if p.notes != nil {
		p.notes.Flush(ctx, p.db, p.logger)
	}
	return nil
}

// Rollback rolls the transaction back, drops its notifications and
// releases its connection. After Commit it does nothing.
func (p *Pipelined) Rollback(ctx context.Context) {
	if p.done {
		return
	}
	if p.conn == nil {
		p.done = true
		_ = p.tx.Rollback(ctx)
		return
	}
	p.end(ctx)
}

// end leaves the connection outside any transaction and releases it. After
// a pipelined COMMIT pgx's transaction object still counts as open, so it
// is rolled back only when the connection is still in a transaction (a
// failure before the COMMIT, or no COMMIT sent); a connection that cannot
// be rolled back is closed by pgx, and the pool discards it.
func (p *Pipelined) end(ctx context.Context) {
	p.done = true
	if p.notes != nil {
		p.notes.take()
	}
	if p.conn.Conn().PgConn().TxStatus() != 'I' {
		if err := p.tx.Rollback(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			p.logger.DebugContext(ctx, "rollback failed; the connection is discarded", "error", err)
		}
	}
	p.conn.Release()
}

// take returns the collected notifications, sorted and without duplicates,
// and forgets them.
func (d *Deferred) take() []Notification {
	d.mu.Lock()
	ns := d.ns
	d.ns = nil
	d.mu.Unlock()
	slices.SortFunc(ns, compareNotifications)
	return slices.Compact(ns)
}

func channelsOf(ns []Notification) []string {
	cs, _ := columns(ns)
	return cs
}

// columns splits ns into qSend's two arrays.
func columns(ns []Notification) (channels, payloads []string) {
	channels, payloads = make([]string, len(ns)), make([]string, len(ns))
	for i, n := range ns {
		channels[i], payloads[i] = n.Channel, n.Payload
	}
	return channels, payloads
}

// InOneTrip runs b's statements as one transaction and sends ns after its
// commit: on a pool in one round trip (BEGIN, b, COMMIT, the notification
// statement in a pipeline; see Pipelined for why the notification stays
// outside the transaction), for a writer whose transaction needs no
// results before its commit. err is the transaction's (nil: committed);
// notifyErr a notification that failed after the commit, for the caller to
// log (the listeners' polling covers it). On any other handle it is InTx
// with Announce: a savepoint in the caller's transaction, whose commit then
// delivers ns.
func InOneTrip(ctx context.Context, db pgdb.DB, b *pgx.Batch, ns ...Notification) (notifyErr, err error) {
	pool, ok := db.(acquirer)
	if !ok {
		err = InTx(ctx, db, nil, func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			return Announce(ctx, tx, ns...)
		})
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	all := &pgx.Batch{}
	all.BeginTx(pgx.TxOptions{})
	all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
	committed := false
	all.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return errCommitRollback
		}
		committed = true
		return nil
	})
	ns = slices.Clone(ns)
	slices.SortFunc(ns, compareNotifications)
	if ns = slices.Compact(ns); len(ns) > 0 {
		channels, payloads := columns(ns)
		all.Queue(qSend, channels, payloads)
	}
	br := conn.SendBatch(ctx, all)
	tx := br.Tx()
	err = br.Close()
	switch {
	case err == nil:
		return nil, nil
	case committed:
		return fmt.Errorf("pgnotify: notify after commit: %w", err), nil
	}
	if conn.Conn().PgConn().TxStatus() != 'I' {
		_ = tx.Rollback(context.WithoutCancel(ctx)) // else pgx closes the connection and the pool discards it
	}
	return nil, err
}
