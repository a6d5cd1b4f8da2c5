package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// CleanerConfig tunes the Cleaner. The zero value of a field means its default.
type CleanerConfig struct {
	// Retention is how long markers are kept. It must exceed the longest time
	// the broker may still deliver an event: a Pub/Sub subscription retains
	// unacked messages for at most 7 days by default (31 with topic
	// retention), and a dead-letter replay may come days later. A marker
	// deleted before its last redelivery lets that redelivery apply twice.
	// Default 14 days (2× the subscription's retention); at least 24h.
	Retention time.Duration
	// BatchSize bounds each DELETE, so cleanup never holds many row locks or
	// one huge WAL record. Default 5000.
	BatchSize int
	// Interval between cleanup passes. Default 1h.
	Interval time.Duration
}

func (c *CleanerConfig) setDefaults() {
	if c.Retention == 0 {
		c.Retention = 14 * 24 * time.Hour
	}
	if c.BatchSize == 0 {
		c.BatchSize = 5000
	}
	if c.Interval == 0 {
		c.Interval = time.Hour
	}
}

// Validate reports an unusable configuration; errors name the field. A zero
// field means its default, so it is valid.
func (c CleanerConfig) Validate() error {
	c.setDefaults()
	var errs []error
	if c.Retention < 24*time.Hour {
		errs = append(errs, fmt.Errorf("consumer: Retention %v: want at least 24h (longer than the broker's redelivery window)", c.Retention))
	}
	if c.BatchSize < 1 || c.BatchSize > 100000 {
		errs = append(errs, fmt.Errorf("consumer: BatchSize %d: want 1..100000", c.BatchSize))
	}
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("consumer: Interval %v: want > 0", c.Interval))
	}
	return errors.Join(errs...)
}

// qCleanup deletes one bounded batch of expired markers, oldest first via
// processed_events_processed_at_idx. The LIMIT lives in a subquery because
// DELETE has none.
const qCleanup = `
DELETE FROM {schema}.processed_events
WHERE (consumer, event_id) IN (
    SELECT consumer, event_id FROM {schema}.processed_events
    WHERE processed_at < $1
    ORDER BY processed_at
    LIMIT $2
)`

// Cleaner deletes expired markers in batches.
type Cleaner struct {
	db      pgdb.Executor
	cleanup string
	cfg     CleanerConfig
	logger  *slog.Logger
}

// NewCleaner returns a cleaner of db's processed_events. Of the options it
// uses WithSchema.
func NewCleaner(db pgdb.Executor, cfg CleanerConfig, logger *slog.Logger, opts ...Option) (*Cleaner, error) {
	if db == nil || logger == nil {
		return nil, errors.New("consumer: NewCleaner needs a database handle and a logger")
	}
	o, err := optionsOf(opts)
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Cleaner{db: db, cleanup: pgmigrate.Render(qCleanup, o.schema), cfg: cfg, logger: logger}, nil
}

// CleanOnce deletes every marker older than now - Retention, batch by batch,
// and returns how many it deleted.
func (c *Cleaner) CleanOnce(ctx context.Context, now time.Time) (int64, error) {
	cutoff := now.Add(-c.cfg.Retention)
	var total int64
	for {
		tag, err := c.db.Exec(ctx, c.cleanup, cutoff, c.cfg.BatchSize)
		if err != nil {
			return total, fmt.Errorf("consumer: cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(c.cfg.BatchSize) {
			return total, nil
		}
	}
}

// Run cleans every Interval until ctx is cancelled; it returns nil then.
func (c *Cleaner) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		n, err := c.CleanOnce(ctx, time.Now())
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			c.logger.ErrorContext(ctx, "processed-events cleanup failed; retrying next interval", "error", err)
		case n > 0:
			c.logger.InfoContext(ctx, "processed-events cleanup", "deleted", n, "retention", c.cfg.Retention)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
