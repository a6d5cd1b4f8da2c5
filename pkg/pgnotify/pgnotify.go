// Package pgnotify wakes a polling loop on PostgreSQL NOTIFY. The relays of
// this system (outbox, inbox) poll as a safety net and listen to cut the
// wait: a notification is sent at commit of the inserting transaction, so a
// woken relay always sees the new rows.
package pgnotify

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/backoff"
)

// Listen holds a dedicated connection (a pool connection would be pinned by
// LISTEN) on channel and calls onNotify with each notification's payload
// until ctx is cancelled. After every (re)connect it calls onNotify("")
// once, because notifications sent while nobody listened are lost. A lost
// connection is retried with reconnect's delays; meanwhile the caller's
// polling covers.
func Listen(ctx context.Context, conn *pgx.ConnConfig, channel string, reconnect backoff.Policy, logger *slog.Logger, onNotify func(payload string)) {
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
