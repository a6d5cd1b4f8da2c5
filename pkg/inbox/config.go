package inbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/lossless-dev/lossless/pkg/retry"
)

// Config tunes the Relay. The zero value of a field means its default; the
// reasoning behind the defaults is in docs/adr/0008. Where the tables are is
// not a tunable of the relay alone: see WithSchema.
type Config struct {
	// BatchSize is the number of entries claimed per transaction. Default 100.
	BatchSize int
	// PollInterval is the wait after a claim found nothing due, unless a
	// NOTIFY from a new insert wakes the relay first. Default 200ms: the
	// fallback when the LISTEN connection is down, and the pick-up delay of
	// entries that become due by time (backoff) or by SQL repair.
	PollInterval time.Duration
	// SweepInterval bounds how long the keyset cursor may run ahead: every
	// SweepInterval the claim restarts from the lowest open id, picking up
	// entries that became due, were blocked by an older entry of their key,
	// or committed late with a lower id. Default 1s.
	SweepInterval time.Duration
	// MaxAttempts and MaxAge bound a Deferred rejection (F5, F8): the entry
	// is parked once it was tried at least MaxAttempts times AND was received
	// at least MaxAge ago. Defaults 10 and 15m.
	MaxAttempts int
	MaxAge      time.Duration
	// DeferBackoff spaces the attempts of a Deferred entry. Default Base 1s,
	// Max 5m, Floor 0.5 (every delay at least half its ceiling): an entry
	// that never becomes applicable (F8, unknown order) costs 12 to 15
	// attempts before MaxAge parks it, not dozens, while the first retries
	// stay within seconds. An early completion (F5) does not wait for its
	// backoff: the hand-off's commit makes it due.
	DeferBackoff retry.Backoff
	// TechnicalBackoff spaces the attempts after a technical error of one
	// entry, and the relay's own retries when a claim fails (database down).
	// Default Base 500ms, Max 1m.
	TechnicalBackoff retry.Backoff
	// HandlerTimeout bounds one batch's transaction. Default 30s.
	HandlerTimeout time.Duration
	// OutageProbeInterval caps the relay's wait after a batch failed because
	// the database is unreachable (pgdb.IsUnavailable), in place of
	// TechnicalBackoff's growing delay: a database that comes back is noticed
	// within this interval, at the cost of one failed connection attempt per
	// interval while it is down. Default 1s.
	OutageProbeInterval time.Duration
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.PollInterval == 0 {
		c.PollInterval = 200 * time.Millisecond
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Second
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.MaxAge == 0 {
		c.MaxAge = 15 * time.Minute
	}
	if c.DeferBackoff.Base == 0 {
		c.DeferBackoff.Base = time.Second
	}
	if c.DeferBackoff.Max == 0 {
		c.DeferBackoff.Max = 5 * time.Minute
	}
	if c.DeferBackoff.Floor == 0 {
		c.DeferBackoff.Floor = 0.5
	}
	if c.TechnicalBackoff.Base == 0 {
		c.TechnicalBackoff.Base = 500 * time.Millisecond
	}
	if c.TechnicalBackoff.Max == 0 {
		c.TechnicalBackoff.Max = time.Minute
	}
	if c.HandlerTimeout == 0 {
		c.HandlerTimeout = 30 * time.Second
	}
	if c.OutageProbeInterval == 0 {
		c.OutageProbeInterval = time.Second
	}
}

// Validate reports an unusable configuration. A zero field means its
// default, so it is valid.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		errs = append(errs, fmt.Errorf("inbox: BatchSize %d: want 1..10000", c.BatchSize))
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"PollInterval", c.PollInterval}, {"SweepInterval", c.SweepInterval}, {"MaxAge", c.MaxAge},
		{"HandlerTimeout", c.HandlerTimeout}, {"OutageProbeInterval", c.OutageProbeInterval}} {
		if f.d <= 0 {
			errs = append(errs, fmt.Errorf("inbox: %s %v: want > 0", f.name, f.d))
		}
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("inbox: MaxAttempts %d: want at least 1", c.MaxAttempts))
	}
	errs = append(errs, c.DeferBackoff.Validate(), c.TechnicalBackoff.Validate())
	return errors.Join(errs...)
}
