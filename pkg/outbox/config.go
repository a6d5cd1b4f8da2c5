package outbox

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/retry"
)

// Defaults of Config; see each field for the reasoning.
const (
	DefaultBatchSize           = 500
	DefaultDispatchConcurrency = 16
	DefaultBatchesInFlight     = 2
	DefaultPollInterval        = time.Second
	DefaultSweepInterval       = time.Second
	DefaultLeaseDuration       = 30 * time.Second
	DefaultBackoffBase         = time.Second
	DefaultBackoffMax          = 5 * time.Minute
	DefaultMaxAttempts         = 12
	DefaultRetention           = 24 * time.Hour
	DefaultCleanupInterval     = time.Minute
	DefaultCleanupBatch        = 1000
	DefaultStatsInterval       = 15 * time.Second
	DefaultStatsCountLimit     = 1_000_000

	DefaultCircuitThreshold        = 5
	DefaultCircuitProbeInterval    = time.Second
	DefaultCircuitProbeIntervalMax = 2 * time.Second
	DefaultOutageProbeInterval     = time.Second
)

// DefaultSlowDispatchConcurrency is BatchesInFlight × DispatchConcurrency at
// their defaults: switching a type to slow mode keeps its concurrency.
const DefaultSlowDispatchConcurrency = 32

// Config of a Relay: its tunables. The zero value of every field means its
// default; NewRelay fills the defaults and validates. The schema of the
// tables is not a tunable but wiring, chosen with WithSchema.
type Config struct {
	// RelayID names this relay in logs and, while a batch is in flight, as
	// the application_name of its session, so an operator can see which
	// replica holds which rows; it also starts the tokens of its leases. A
	// relay ends, at its start, the live leases of a previous process with
	// its id (the instance restarted), so it must be unique among live
	// relays: a stable instance name (a pod's name) or the default,
	// "<hostname>-<pid>-<random>".
	RelayID string
	// BatchSize is the most rows one claim takes. Default 500: large enough
	// that the round trips and the commit of a batch cost little per row,
	// small enough that a batch dispatches well within LeaseDuration.
	BatchSize int
	// BatchesInFlight is how many batches one relay works on at once: while
	// one is dispatched and recorded, the next is claimed, so the database
	// and the relay work at the same time. The claims of one relay are
	// serialised (its batches never overlap); each batch in flight holds a
	// pool connection. Default 2.
	BatchesInFlight int
	// DispatchConcurrency is how many aggregates of one batch dispatch in
	// parallel; events of one aggregate always dispatch one after another.
	// Default 16.
	DispatchConcurrency int
	// SlowDispatchConcurrency is how many events of the slow types
	// (WithSlowDispatch) one relay dispatches at once, each leased and
	// settled on its own; a worker that finishes is refilled at once. It
	// holds no connection while dispatching. Default 32, the lock claim's
	// concurrency at its defaults (BatchesInFlight × DispatchConcurrency).
	SlowDispatchConcurrency int
	// PollInterval is the fallback wake-up when no NOTIFY arrives (lost
	// notification, LISTEN connection down). Default 1s.
	PollInterval time.Duration
	// SweepInterval bounds how long the relay's keyset cursor may run ahead
	// before one claim restarts from the oldest pending row, to pick up rows
	// the cursor passed: retry-due rows, rows another relay held and released,
	// events that were blocked behind an earlier event of their aggregate, and
	// late commits whose NOTIFY was lost. Default 1s.
	SweepInterval time.Duration
	// LeaseDuration bounds a batch's claim transaction, whose row locks keep
	// other relays off its rows: dispatch is cut off at 80% of it, the relay
	// gives up on the transaction at 100%, and the server ends a transaction
	// left idle that long (idle_in_transaction_session_timeout), releasing the
	// rows of a relay that hangs or vanishes without closing its connection.
	// A relay that dies releases its rows at once. Default 30s.
	LeaseDuration time.Duration
	// BackoffBase and BackoffMax shape the delay before a transient failure is
	// retried: full jitter in [0, min(BackoffMax, BackoffBase·2^(n-1))].
	// Defaults 1s and 5m.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// MaxAttempts bounds dispatch attempts; the attempt that reaches it moves
	// the row to FAILED. Default 12: with 1s base and 5m cap the retries span
	// about 30 minutes on average, longer than a Pub/Sub regional incident or
	// a database fail-over we expect to ride out, short enough to alert the
	// same day.
	MaxAttempts int
	// CircuitThreshold is how many dispatches in a row to one dependency
	// (one event type, or the types grouped by WithDependency) must fail
	// with an Unavailable error before the relay stops dispatching to it;
	// such failures charge no attempt and no backoff (circuit.go).
	// Default 5: a handful of refused connections is an outage, not chance.
	CircuitThreshold int
	// CircuitProbeInterval is the wait from the circuit opening to the first
	// probe, a single dispatch that tests the dependency; every failed probe
	// doubles it up to CircuitProbeIntervalMax. The dependency's backlog goes
	// out at most CircuitProbeIntervalMax after it is back. A probe costs one
	// dispatch, so probing often is cheap. Defaults 1s and 2s.
	CircuitProbeInterval    time.Duration
	CircuitProbeIntervalMax time.Duration
	// OutageProbeInterval caps a relay loop's wait after a batch failed
	// because the database is unreachable (pgdb.IsUnavailable), in place of
	// the growing backoff other batch failures get (up to BackoffMax): the
	// loop polls a database that is down and resumes within this interval of
	// its return, instead of sleeping up to minutes past it. Default 1s.
	OutageProbeInterval time.Duration
	// Retention keeps published events (outbox_published) for diagnosis and
	// replay before cleanup deletes them. Undelivered rows (outbox: PENDING,
	// FAILED) are never deleted. Default 24h.
	Retention time.Duration
	// CleanupInterval is how often the relay deletes expired published rows;
	// CleanupBatch bounds one DELETE so it never holds many locks or bloats a
	// single transaction. Defaults 1m and 1000 (repeated until done).
	CleanupInterval time.Duration
	CleanupBatch    int
	// StatsInterval is how often the gauges (pending count, oldest pending
	// age, failed count) are recomputed; scrapes read the cached values.
	// Default 15s. StatsCountLimit caps the pending count query so a huge
	// backlog costs a bounded scan. Default 1,000,000.
	StatsInterval   time.Duration
	StatsCountLimit int
}

// setDefaults sets every zero field of c to its default.
func (c *Config) setDefaults() {
	if c.RelayID == "" {
		host, _ := os.Hostname()
		c.RelayID = host + "-" + strconv.Itoa(os.Getpid()) + "-" + uuid.NewString()[:8]
	}
	setInt(&c.BatchSize, DefaultBatchSize)
	setInt(&c.DispatchConcurrency, DefaultDispatchConcurrency)
	setInt(&c.SlowDispatchConcurrency, DefaultSlowDispatchConcurrency)
	setInt(&c.BatchesInFlight, DefaultBatchesInFlight)
	setDur(&c.PollInterval, DefaultPollInterval)
	setDur(&c.SweepInterval, DefaultSweepInterval)
	setDur(&c.LeaseDuration, DefaultLeaseDuration)
	setDur(&c.BackoffBase, DefaultBackoffBase)
	setDur(&c.BackoffMax, DefaultBackoffMax)
	setInt(&c.MaxAttempts, DefaultMaxAttempts)
	setInt(&c.CircuitThreshold, DefaultCircuitThreshold)
	setDur(&c.CircuitProbeInterval, DefaultCircuitProbeInterval)
	if c.CircuitProbeIntervalMax == 0 {
		c.CircuitProbeIntervalMax = max(DefaultCircuitProbeIntervalMax, c.CircuitProbeInterval)
	}
	setDur(&c.OutageProbeInterval, DefaultOutageProbeInterval)
	setDur(&c.Retention, DefaultRetention)
	setDur(&c.CleanupInterval, DefaultCleanupInterval)
	setInt(&c.CleanupBatch, DefaultCleanupBatch)
	setDur(&c.StatsInterval, DefaultStatsInterval)
	setInt(&c.StatsCountLimit, DefaultStatsCountLimit)
}

// Validate reports settings that cannot work. Zero values are valid (they
// mean the defaults); negative ones are not.
func (c Config) Validate() error {
	var errs []error
	positive := func(name string, v int64) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("outbox config: %s must not be negative", name))
		}
	}
	positive("BatchSize", int64(c.BatchSize))
	positive("DispatchConcurrency", int64(c.DispatchConcurrency))
	positive("SlowDispatchConcurrency", int64(c.SlowDispatchConcurrency))
	positive("BatchesInFlight", int64(c.BatchesInFlight))
	positive("PollInterval", int64(c.PollInterval))
	positive("SweepInterval", int64(c.SweepInterval))
	positive("LeaseDuration", int64(c.LeaseDuration))
	positive("MaxAttempts", int64(c.MaxAttempts))
	positive("CircuitThreshold", int64(c.CircuitThreshold))
	positive("CircuitProbeInterval", int64(c.CircuitProbeInterval))
	positive("CircuitProbeIntervalMax", int64(c.CircuitProbeIntervalMax))
	positive("OutageProbeInterval", int64(c.OutageProbeInterval))
	positive("Retention", int64(c.Retention))
	positive("CleanupInterval", int64(c.CleanupInterval))
	positive("CleanupBatch", int64(c.CleanupBatch))
	positive("StatsInterval", int64(c.StatsInterval))
	positive("StatsCountLimit", int64(c.StatsCountLimit))
	if c.BatchesInFlight > 16 {
		errs = append(errs, errors.New("outbox config: BatchesInFlight above 16 holds more connections than it can use"))
	}
	if c.BatchSize > 10_000 {
		errs = append(errs, errors.New("outbox config: BatchSize above 10000 holds too many row locks in one claim"))
	}
	if err := (retry.Backoff{Base: c.BackoffBase, Max: c.BackoffMax}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("outbox config: %w", err))
	}
	if c.CircuitProbeInterval > 0 && c.CircuitProbeIntervalMax > 0 && c.CircuitProbeIntervalMax < c.CircuitProbeInterval {
		errs = append(errs, errors.New("outbox config: CircuitProbeIntervalMax must not be below CircuitProbeInterval"))
	}
	if c.Retention > 0 && c.Retention < time.Minute {
		errs = append(errs, errors.New("outbox config: Retention below 1m leaves no time to diagnose a published event"))
	}
	return errors.Join(errs...)
}

func setInt(p *int, def int) {
	if *p == 0 {
		*p = def
	}
}

func setDur(p *time.Duration, def time.Duration) {
	if *p == 0 {
		*p = def
	}
}
