package inbox

import (
	"context"
	"fmt"

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
// (pgnotify.Send: after it, if the caller began tx under pgnotify.Defer). Call it when
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
	if tag.RowsAffected() == 0 {
		return 0, nil
	}
	if err := pgnotify.Send(ctx, tx, s.q.channel, ""); err != nil {
		return 0, fmt.Errorf("inbox: %w", err)
	}
	return tag.RowsAffected(), nil
}
