package outbox

import (
	"context"
	"fmt"
	"time"
)

// Beside the loop: the gauges' numbers, refreshed every StatsInterval, and
// the deletion of published rows past their retention and of journal rows
// nobody consumed, every CleanupInterval.

// Stats is a snapshot of the outbox table, for metrics, the runbook and
// admin endpoints.
type Stats struct {
	// Pending counts rows not yet published and not FAILED (PENDING and
	// being dispatched), capped at Config.StatsCountLimit.
	Pending int64
	// Failed counts FAILED rows (within the same capped scan).
	Failed int64
	// OldestPendingAge is the age (now - created_at) of the oldest pending
	// row; 0 when there is none. A dead relay shows here first.
	OldestPendingAge time.Duration
}

// Stats reads the current numbers from the database (bounded queries:
// counts stop at StatsCountLimit).
func (r *Relay) Stats(ctx context.Context) (Stats, error) {
	var (
		s      Stats
		oldest *time.Time
	)
	now := r.now()
	rows, err := r.pool.Query(ctx, r.q.stats, r.cfg.StatsCountLimit)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	defer rows.Close()
	if rows.Next() {
		if err := rows.Scan(&s.Pending, &s.Failed, &oldest); err != nil {
			return Stats{}, fmt.Errorf("outbox: stats: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	if oldest != nil && now.After(*oldest) {
		s.OldestPendingAge = now.Sub(*oldest)
	}
	return s, nil
}

// Cleanup deletes outbox_published rows older than the retention, in bounded
// batches, and returns how many it deleted. Run calls it every
// CleanupInterval.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	cutoff := r.now().Add(-r.cfg.Retention)
	var total int64
	for range 100 { // at most 100 batches per call; the next interval continues
		tag, err := r.pool.Exec(ctx, r.q.cleanup, cutoff, r.cfg.CleanupBatch)
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.cfg.CleanupBatch) {
			break
		}
	}
	return total, nil
}

// maintain refreshes the gauges every StatsInterval and deletes expired
// published rows every CleanupInterval.
func (r *Relay) maintain(ctx context.Context) {
	refresh := func() {
		s, err := r.Stats(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("outbox stats failed", "error", err)
			}
			return
		}
		r.stats.Store(&s)
	}
	refresh()
	statsT := time.NewTicker(r.cfg.StatsInterval)
	defer statsT.Stop()
	cleanT := time.NewTicker(r.cfg.CleanupInterval)
	defer cleanT.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-statsT.C:
			refresh()
		case <-cleanT.C:
			n, err := r.Cleanup(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				r.log.Warn("outbox cleanup failed", "error", err)
			case n > 0:
				r.log.Info("outbox cleanup deleted published rows", "rows", n, "retention", r.cfg.Retention)
			}
			if err := r.collectJournal(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox journal cleanup failed", "error", err)
			}
		}
	}
}
