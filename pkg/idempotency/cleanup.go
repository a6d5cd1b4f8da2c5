package idempotency

import (
	"context"
	"fmt"
	"time"
)

// Deleting by primary key from a bounded, oldest-first sub-select keeps each
// statement short; SKIP LOCKED lets two cleaners (two replicas) split the work
// instead of queueing, and never touches a key a live request is claiming.
const cleanupSQL = `
DELETE FROM {schema}.idempotency_keys
WHERE (scope, principal, key) IN (
    SELECT scope, principal, key FROM {schema}.idempotency_keys
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED)`

// Cleanup deletes every expired key in batches of Config.CleanupBatch and
// returns how many it deleted.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := s.db.Exec(ctx, s.sql.cleanup, s.cfg.CleanupBatch)
		if err != nil {
			return total, fmt.Errorf("idempotency: cleanup: %w", err)
		}
		n := tag.RowsAffected()
		total += n
		s.keysDeleted.Add(ctx, n)
		if n < int64(s.cfg.CleanupBatch) {
			return total, nil
		}
	}
}

// RunCleanup runs Cleanup every Config.CleanupInterval until ctx is
// cancelled, then returns nil. A failed pass is logged and retried at the next
// interval: leftover expired keys cost space, not correctness.
func (s *Store) RunCleanup(ctx context.Context) error {
	t := time.NewTicker(s.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := s.Cleanup(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.WarnContext(ctx, "idempotency key cleanup failed", "error", err, "deleted", n)
		case n > 0:
			s.log.InfoContext(ctx, "idempotency keys cleaned up", "deleted", n)
		}
	}
}
