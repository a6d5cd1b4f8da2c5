package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

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
// (pgnotify.Send: after it, if the caller runs tx through pgnotify.InTx). Call it when
// the condition those entries wait for becomes true: the work-order service
// calls it when it records a waiting point, so a completion that overtook
// its hand-off (F5) applies right after the hand-off commits instead of
// after its backoff. It returns the number of entries made due. Of the
// options it uses WithSchema; its statement is rendered per call, a few
// string operations against a database round trip.
func MakeDue(ctx context.Context, tx pgx.Tx, key string, opts ...Option) (int64, error) {
	o, err := newOptions(opts)
	if err != nil {
		return 0, err
	}
	q := newQueries(o.schema)
	tag, err := tx.Exec(ctx, q.makeDue, key)
	if err != nil {
		return 0, fmt.Errorf("inbox: make entries of %s due: %w", key, err)
	}
	if tag.RowsAffected() == 0 {
		return 0, nil
	}
	if err := pgnotify.Send(ctx, tx, q.channel, ""); err != nil {
		return 0, fmt.Errorf("inbox: %w", err)
	}
	return tag.RowsAffected(), nil
}
