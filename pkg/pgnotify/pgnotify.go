// Package pgnotify wakes a polling loop on PostgreSQL NOTIFY: it listens
// (Listen, Wake) and notifies (Notify), and holds no transaction code. The
// relays of this system (outbox, inbox, lease queue) poll as a safety net
// and listen to cut the wait. Writers announce new rows with Notify through
// the handle they write with: in a pgdb.Tx the wake-up is queued on the
// transaction and sent after its commit, in its round trip (pgdb's package
// doc says why outside it), so a woken relay always sees the new rows and a
// rolled-back transaction wakes nobody.
//
// Lesson: a notification is a hint, never the record: the rows are, so a
// relay that listens still polls, and a lost NOTIFY costs latency, never a
// row. It guards no numbered failure mode; it is the "Wake-ups" entry of
// docs/failure-modes.md: a writer killed between its commit and the
// notification, or a failed send, delays its rows by one poll (ADR 0002
// revision 4).
package pgnotify

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

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

// qNotifyNow sends notifications outside any transaction, in one statement
// and so an implicit transaction of its own, whose commit does not wait for
// the WAL flush: set_config(..., true) turns synchronous_commit off for that
// transaction only (a wake-up needs no durability; pgdb's qNotify says why
// it matters). The rows it announces are committed already.
const qNotifyNow = `
SELECT set_config('synchronous_commit', 'off', true), pg_notify(n.channel, n.payload)
  FROM unnest($1::text[], $2::text[]) AS n(channel, payload)`

// qNotifyInTx notifies inside a transaction begun elsewhere: delivered at
// its commit, under PostgreSQL's global NOTIFY lock for its whole flush.
const qNotifyInTx = `
SELECT pg_notify(n.channel, n.payload) FROM unnest($1::text[], $2::text[]) AS n(channel, payload)`

// Notification is one NOTIFY: channel and payload.
type Notification struct {
	Channel, Payload string
}

// Notify announces ns to their listeners for rows written through db:
//
//   - in a *pgdb.Tx, queued on it (pgdb.Tx.Notify): sent after its commit,
//     in its round trip, nothing after a rollback;
//   - in another pgx.Tx, sent in it: delivered at its commit, under the
//     global NOTIFY lock for its flush (correct, slower);
//   - on a pool or a connection, the rows are committed already: sent now,
//     in a transaction of their own that does not wait for the WAL flush.
//
// A lost notification (an error here, a crash before the send) costs the
// listener its poll interval, never data: listeners of this system also
// poll.
func Notify(ctx context.Context, db pgdb.Executor, ns ...Notification) error {
	if len(ns) == 0 {
		return nil
	}
	if tx, ok := db.(*pgdb.Tx); ok {
		for _, n := range ns {
			tx.Notify(n.Channel, n.Payload)
		}
		return nil
	}
	q := qNotifyNow
	if _, ok := db.(pgx.Tx); ok {
		q = qNotifyInTx
	}
	channels, payloads := make([]string, len(ns)), make([]string, len(ns))
	for i, n := range ns {
		channels[i], payloads[i] = n.Channel, n.Payload
	}
	if _, err := db.Exec(ctx, q, channels, payloads); err != nil {
		return fmt.Errorf("pgnotify: notify %s: %w", strings.Join(slices.Compact(slices.Sorted(slices.Values(channels))), ", "), err)
	}
	return nil
}
