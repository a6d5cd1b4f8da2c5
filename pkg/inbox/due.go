package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgnotify"
)

// qMakeDue pulls the next attempt of a key's deferred entries to now. It
// touches only OPEN entries waiting for a later attempt: entries already due
// are claimable anyway, and resolved or parked ones are not the relay's.
//
// SKIP LOCKED avoids a lock-order inversion: the caller holds the order's row
// lock and comes here second, while a relay that claimed an entry of the
// same order (entry lock first) waits for that order lock. Waiting for the
// entry would deadlock; skipping it is safe, because that relay reads the
// order and its waiting points only after the caller commits and releases
// the order lock, so it sees the waiting point anyway.
const qMakeDue = `
UPDATE {schema}.inbox SET next_attempt_at = now()
WHERE id IN (
    SELECT id FROM {schema}.inbox
    WHERE correlation_key = $1 AND status = 'OPEN' AND next_attempt_at > now()
    FOR UPDATE SKIP LOCKED
)`

// MakeDue makes the deferred entries of one correlation key due at once, in
// the caller's transaction, and wakes the relays at its commit
// (pgnotify.Notify: after it, if tx is a pgdb.Tx). Call it when
// the condition those entries wait for becomes true: the work-order service
// calls it when it records a waiting point, so a completion that overtook
// its hand-off (F5) applies right after the hand-off commits instead of
// after its backoff. It returns the number of entries made due. It works in
// the Store's schema and runs through tx, not the Store's own handle.
func (s *Store) MakeDue(ctx context.Context, tx pgdb.Executor, key string) (int64, error) {
	tag, err := tx.Exec(ctx, s.q.makeDue, key)
	if err != nil {
		return 0, fmt.Errorf("inbox: make entries of %s due: %w", key, err)
	}
	return s.announceDue(ctx, tx, tag.RowsAffected())
}

// QueueMakeDue is MakeDue for a caller that sends its own statements in one
// round trip (a pgx.Batch sent through its transaction): it queues the
// statement on b, and the returned Due, once b has been sent, says how many
// entries were made due and wakes the relays. The hand-off queues it after
// the order's save (ADR 0002, revision 5).
func (s *Store) QueueMakeDue(b *pgx.Batch, key string) *Due {
	d := &Due{s: s}
	b.Queue(s.q.makeDue, key).Exec(func(tag pgconn.CommandTag) error {
		d.n = tag.RowsAffected()
		return nil
	})
	return d
}

// Due is the result of a statement QueueMakeDue queued.
type Due struct {
	s *Store
	n int64
}

// Announce wakes the relays at the commit of tx if entries were made due
// (as MakeDue does) and returns how many. Call it after the batch was sent
// without error.
func (d *Due) Announce(ctx context.Context, tx pgdb.Executor) (int64, error) {
	return d.s.announceDue(ctx, tx, d.n)
}

func (s *Store) announceDue(ctx context.Context, tx pgdb.Executor, n int64) (int64, error) {
	if n == 0 {
		return 0, nil
	}
	if err := pgnotify.Notify(ctx, tx, pgnotify.Notification{Channel: s.q.channel}); err != nil {
		return 0, fmt.Errorf("inbox: %w", err)
	}
	return n, nil
}
