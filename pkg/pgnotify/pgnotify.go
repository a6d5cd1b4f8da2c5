// Package pgnotify wakes a polling loop on PostgreSQL NOTIFY. The relays of
// this system (outbox, inbox, lease queue) poll as a safety net and listen to
// cut the wait. Writers send the notification after the inserting
// transaction commits, so a woken relay always sees the new rows, and
// outside that transaction, because a NOTIFY inside it would hold
// PostgreSQL's global notification lock across the commit's flush. InTx is
// how a writer runs such a transaction: the writes announce (Send, e.g. by
// outbox.Append) and InTx sends after the commit, nothing after a rollback.
// Defer and Flush are its parts, for a loop that manages its transaction
// itself.
//
// Lesson: a notification is a hint, never the record: the rows are, so a
// relay that listens still polls, and a lost NOTIFY costs latency, never a
// row. It guards no numbered failure mode; it is the "Wake-ups" entry of
// docs/failure-modes.md: a writer killed between its commit and the
// notification, or a failed send, delays its rows by one poll (ADR 0002
// revision 4).
package pgnotify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// Listen holds a dedicated connection (a pool connection would be pinned by
// LISTEN) on channel and calls onNotify with each notification's payload
// until ctx is cancelled. After every (re)connect it calls onNotify("")
// once, because notifications sent while nobody listened are lost. A lost
// connection is retried with reconnect's delays; meanwhile the caller's
// polling covers.
func Listen(ctx context.Context, conn *pgx.ConnConfig, channel string, reconnect retry.Backoff, logger *slog.Logger, onNotify func(payload string)) {
	for attempt := 1; ctx.Err() == nil; attempt++ {
		err := listenOnce(ctx, conn, channel, onNotify)
		if ctx.Err() != nil {
			return
		}
		delay := reconnect.Delay(attempt)
		logger.WarnContext(ctx, "LISTEN connection lost; polling until it is back", "channel", channel, "error", err, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func listenOnce(ctx context.Context, cfg *pgx.ConnConfig, channel string, onNotify func(string)) error {
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	onNotify("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		onNotify(n.Payload)
	}
}

// Wake is a one-slot signal: many notifications between two polls collapse
// into one wake-up.
type Wake chan struct{}

// NewWake returns a ready Wake.
func NewWake() Wake { return make(Wake, 1) }

// Signal wakes the waiter without blocking.
func (w Wake) Signal() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// Sending. PostgreSQL serialises every committing transaction that has sent
// a NOTIFY, across all databases of the server: from just before its commit
// record until the end of the commit it holds one global lock, so that
// notifications are queued in commit order. With fsync on, that hold
// includes the WAL flush, so notifying transactions commit one at a time and
// group commit cannot batch them; on a 2-core machine this lock capped the
// whole pipeline (ADR 0002, revision 4). The notification is therefore sent
// after the business transaction commits, in a transaction of its own whose
// commit does not wait for the flush (a wake-up needs no durability): the
// lock is held for microseconds instead of a flush.

// qSend sends notifications in one statement, i.e. its own implicit
// transaction. set_config(..., true) turns synchronous_commit off for that
// transaction only; it is read at the commit, which happens before the
// setting is reverted.
const qSend = `
SELECT set_config('synchronous_commit', 'off', true), pg_notify(n.channel, n.payload)
  FROM unnest($1::text[], $2::text[]) AS n(channel, payload)`

// qSendInTx is the fallback inside the business transaction: delivered at
// its commit, under the global lock for the whole flush.
const qSendInTx = `SELECT pg_notify($1, $2)`

// Execer runs a statement: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Notification is one NOTIFY: channel and payload.
type Notification struct {
	Channel, Payload string
}

// Notify sends ns now, each delivered once this call returns, in a
// transaction of its own that does not wait for the WAL flush. Call it after
// the transaction whose rows the notifications announce has committed, with
// a pool or a connection outside any transaction: inside one, it would make
// that transaction's commit non-durable, so it refuses a pgx.Tx. A lost
// notification (an error here, a crash before the call) costs the listener
// its poll interval, never data: listeners of this system also poll.
func Notify(ctx context.Context, db Execer, ns ...Notification) error {
	if len(ns) == 0 {
		return nil
	}
	if _, ok := db.(pgx.Tx); ok {
		return errors.New("pgnotify: Notify inside a transaction would make its commit non-durable; pass the pool")
	}
	channels, payloads := make([]string, len(ns)), make([]string, len(ns))
	for i, n := range ns {
		channels[i], payloads[i] = n.Channel, n.Payload
	}
	if _, err := db.Exec(ctx, qSend, channels, payloads); err != nil {
		return fmt.Errorf("pgnotify: notify %s: %w", strings.Join(slices.Compact(slices.Sorted(slices.Values(channels))), ", "), err)
	}
	return nil
}

// Announce notifies ns for rows written through db. If db is a transaction,
// they go as Send sends them, at or after its commit; otherwise the rows are
// committed already and they are sent now, as Notify sends them. For a
// package whose writes take either a pool or the caller's transaction.
func Announce(ctx context.Context, db Execer, ns ...Notification) error {
	if _, ok := db.(pgx.Tx); !ok {
		return Notify(ctx, db, ns...)
	}
	for _, n := range ns {
		if err := Send(ctx, db, n.Channel, n.Payload); err != nil {
			return err
		}
	}
	return nil
}

// flushTimeout bounds Flush, pool wait included.
const flushTimeout = 5 * time.Second

// Deferred collects the notifications of one transaction, for the code that
// begins and commits it to send after the commit (Defer, Flush).
type Deferred struct {
	mu sync.Mutex
	ns []Notification
}

type deferredKey struct{}

// InTx runs fn in a transaction begun on db and, once it committed, sends
// the notifications fn's writes announced (Send, e.g. by outbox.Append or
// inbox.MakeDue) on db, outside the transaction:
//
//	err := pgnotify.InTx(ctx, pool, logger, func(ctx context.Context, tx pgx.Tx) error {
//		return outbox.Append(ctx, tx, ev)
//	})
//
// fn must do its writes in tx with the ctx it is given. An error from fn,
// Begin or Commit is returned as is, after a rollback, and the
// notifications are dropped: nothing they would announce was committed. A
// notification that fails after the commit is logged on logger (nil: not
// logged) and not returned; the listeners' polling covers it (Flush).
//
// When db is itself a transaction, fn runs in a savepoint and its
// notifications follow that outer transaction: collected for whoever
// deferred them, or else sent at its commit (Send).
func InTx(ctx context.Context, db pgdb.DB, logger *slog.Logger, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if _, nested := db.(pgx.Tx); nested {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return fn(ctx, tx) })
	}
	txCtx, notes := Defer(ctx)
	if err := pgx.BeginFunc(txCtx, db, func(tx pgx.Tx) error { return fn(txCtx, tx) }); err != nil {
		return err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	notes.Flush(ctx, db, logger)
	return nil
}

// Defer returns a context under which Send, in a transaction begun with it,
// collects its notifications into the returned Deferred instead of sending
// them in the transaction. After the commit, call Flush. InTx does both;
// call them yourself only where a loop begins and commits its transaction
// itself:
//
//	ctx, notes := pgnotify.Defer(ctx)
//	tx, err := pool.Begin(ctx)
//	... // writes through tx, then tx.Commit(ctx)
//	notes.Flush(ctx, pool, logger)
//
// Without Defer, Send notifies inside the transaction: correct, but every
// such commit holds PostgreSQL's global NOTIFY lock across its flush. Scope
// the returned context to the one transaction: handed to anything that
// outlives it, it would collect notifications nobody flushes.
func Defer(ctx context.Context) (context.Context, *Deferred) {
	d := &Deferred{}
	return context.WithValue(ctx, deferredKey{}, d), d
}

// Send announces channel/payload to listeners once tx commits: collected
// into ctx's Deferred (Defer) for its owner to send after the commit, or
// else sent by pg_notify in tx and delivered at its commit. A rolled-back
// transaction's collected notifications may still be sent by a careless
// owner: harmless, a listener finds nothing new.
func Send(ctx context.Context, tx Execer, channel, payload string) error {
	if d, ok := ctx.Value(deferredKey{}).(*Deferred); ok && d != nil {
		d.mu.Lock()
		d.ns = append(d.ns, Notification{Channel: channel, Payload: payload})
		d.mu.Unlock()
		return nil
	}
	if _, err := tx.Exec(ctx, qSendInTx, channel, payload); err != nil {
		return fmt.Errorf("pgnotify: notify %s: %w", channel, err)
	}
	return nil
}

// Flush sends the collected notifications (Notify, duplicates dropped) and
// forgets them. Call it once the transaction committed. A failure is logged,
// not returned: the transaction's effect is committed and the listeners'
// polling delivers it anyway, a little later.
func (d *Deferred) Flush(ctx context.Context, db Execer, logger *slog.Logger) {
	d.mu.Lock()
	ns := d.ns
	d.ns = nil
	d.mu.Unlock()
	if len(ns) == 0 {
		return
	}
	slices.SortFunc(ns, compareNotifications)
	ns = slices.Compact(ns)
	// Past the caller's cancellation (the effect is committed) but bounded:
	// a wake-up later than flushTimeout is worth less than the poll.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	if err := Notify(fctx, db, ns...); err != nil {
		logger.WarnContext(ctx, "notification after commit failed; listeners will find the rows by polling", "error", err)
	}
}

// compareNotifications orders notifications by channel, then payload.
func compareNotifications(a, b Notification) int {
	return cmp.Or(cmp.Compare(a.Channel, b.Channel), cmp.Compare(a.Payload, b.Payload))
}
