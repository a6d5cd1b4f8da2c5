package leasequeue

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/lossless-dev/lossless/pkg/retry"
)

// Config of a Queue: its tunables. Zero fields take their defaults. The
// schema of the tables is not a tunable but wiring, chosen with WithSchema.
type Config struct {
	// Name of the queue (leasequeue_jobs.queue): several queues share the
	// table. Required; 1-60 of letters, digits, '.', '_', '-'.
	Name string
	// StatsInterval is how often RunStats refreshes the queue's gauges (jobs
	// by state, expired leases, oldest available age) with one bounded
	// query. Default 15s (a typical scrape interval); scrapes never query.
	StatsInterval time.Duration
	// LeaseDuration is how long a claim holds a job without a heartbeat. It
	// bounds how long a dead worker's job waits before another worker takes it
	// over (plus the Worker's RescueInterval). Default 30s.
	LeaseDuration time.Duration
	// Backoff spaces the retries of failed attempts. Default {Base: 1s, Max:
	// 5m}, full jitter: with DefaultMaxAttempts about half an hour of retries,
	// enough to outlast a database failover or a deploy.
	Backoff retry.Backoff
}

var queueName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,60}$`)

func (c *Config) setDefaults() {
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 30 * time.Second
	}
	if c.StatsInterval == 0 {
		c.StatsInterval = 15 * time.Second
	}
	if c.Backoff.Base == 0 {
		c.Backoff.Base = time.Second
	}
	if c.Backoff.Max == 0 {
		c.Backoff.Max = 5 * time.Minute
	}
}

// Validate reports an unusable configuration.
func (c Config) Validate() error {
	var errs []error
	if !queueName.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("Name %q: want 1-60 of [A-Za-z0-9._-]", c.Name))
	}
	if c.LeaseDuration < 0 || (c.LeaseDuration > 0 && c.LeaseDuration < 10*time.Millisecond) {
		errs = append(errs, fmt.Errorf("LeaseDuration %v: want at least 10ms", c.LeaseDuration))
	}
	if c.StatsInterval < 0 {
		errs = append(errs, fmt.Errorf("StatsInterval %v: want >= 0", c.StatsInterval))
	}
	if err := c.Backoff.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Config.Backoff: %w", err))
	}
	return errors.Join(errs...)
}

// WorkerConfig of a Worker. Zero fields take their defaults.
type WorkerConfig struct {
	// Instance is this worker's identity that survives a restart (a pod or
	// host name, env INSTANCE_ID in the services). When set, Owner is
	// "<Instance>/<pid>-<random>" and Run first releases the jobs an earlier
	// incarnation of the instance still held (Queue.ReleaseInstance): a
	// restarted process redoes its dead predecessor's jobs at once instead of
	// after their lease. Leases of other instances still wait for expiry.
	// Must be unique among live workers of the queue; letters, digits, '.',
	// '_' and '-', at most 100. Default "": no release at start.
	Instance string
	// Owner names this worker in leasequeue_jobs.lease_owner. Default
	// "<hostname>-<pid>-<random>", unique per process start (with Instance:
	// see above; an explicit Owner must then start with "<Instance>/").
	Owner string
	// Workers is how many handlers run at once. Default 10.
	Workers int
	// FetchBatch caps the jobs one claim takes. Default Workers (at most 1000).
	FetchBatch int
	// PollInterval is the wait after a claim found no work, unless a
	// notification (Enqueue, Retry) wakes the worker first. Default 1s.
	PollInterval time.Duration
	// RescueInterval is how often expired leases are looked for. A dead
	// worker's job is redone within LeaseDuration + RescueInterval. Default 1s.
	RescueInterval time.Duration
	// FullScanInterval bounds how long the keyset cursor may run ahead before
	// it rewinds to pick up rows committed behind it. Default 1s.
	FullScanInterval time.Duration
	// HeartbeatInterval is how often running jobs' leases are extended.
	// Default a third of the queue's LeaseDuration, so that two heartbeats
	// may fail before a lease runs out; must be below LeaseDuration (checked
	// by ValidateFor and NewWorker, which know the queue).
	HeartbeatInterval time.Duration
	// CompleteBatch caps the jobs completed in one transaction. Default 256.
	CompleteBatch int
	// Completers is how many completion transactions may be in flight at once.
	// Default 2: one commits while the next batch gathers.
	Completers int
	// ShutdownGrace is how long running handlers may finish after Run's
	// context is cancelled; then they are cancelled and their jobs released.
	// Default 10s.
	ShutdownGrace time.Duration
	// DisableListen turns off LISTEN/NOTIFY wake-ups (one pooled connection
	// per worker); idle workers then find new jobs after PollInterval.
	// Default false.
	DisableListen bool
}

func (c *WorkerConfig) setDefaults() {
	if c.Owner == "" {
		c.Owner = NewOwner(c.Instance)
	}
	if c.Workers == 0 {
		c.Workers = 10
	}
	if c.FetchBatch == 0 {
		c.FetchBatch = min(c.Workers, 1000)
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.RescueInterval == 0 {
		c.RescueInterval = time.Second
	}
	if c.FullScanInterval == 0 {
		c.FullScanInterval = time.Second
	}
	if c.CompleteBatch == 0 {
		c.CompleteBatch = 256
	}
	if c.Completers == 0 {
		c.Completers = 2
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
}

// setQueueDefaults fills the one default that depends on the queue.
func (c *WorkerConfig) setQueueDefaults(queue Config) {
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = queue.LeaseDuration / 3
	}
}

// Validate reports an unusable configuration of the worker's own fields.
// Zero fields take their defaults. The constraint that involves the queue
// (HeartbeatInterval below its LeaseDuration) is ValidateFor's.
func (c WorkerConfig) Validate() error {
	c.setDefaults()
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(len(c.Owner) <= 200, "Owner: at most 200 characters")
	if err := ValidateInstance(c.Instance); err != nil {
		errs = append(errs, err)
	}
	if err := ValidateOwner(c.Owner, c.Instance); err != nil {
		errs = append(errs, err)
	}
	check(c.Workers >= 1 && c.Workers <= 10000, "Workers %d: want 1..10000", c.Workers)
	check(c.FetchBatch >= 1 && c.FetchBatch <= 1000, "FetchBatch %d: want 1..1000", c.FetchBatch)
	check(c.PollInterval > 0, "PollInterval %v: want > 0", c.PollInterval)
	check(c.RescueInterval > 0, "RescueInterval %v: want > 0", c.RescueInterval)
	check(c.FullScanInterval > 0, "FullScanInterval %v: want > 0", c.FullScanInterval)
	check(c.HeartbeatInterval >= 0, "HeartbeatInterval %v: want >= 0", c.HeartbeatInterval)
	check(c.CompleteBatch >= 1 && c.CompleteBatch <= 10000, "CompleteBatch %d: want 1..10000", c.CompleteBatch)
	check(c.Completers >= 1 && c.Completers <= 64, "Completers %d: want 1..64", c.Completers)
	check(c.ShutdownGrace > 0, "ShutdownGrace %v: want > 0", c.ShutdownGrace)
	return errors.Join(errs...)
}

// ValidateFor is Validate for a worker of a queue configured with queue
// (zero fields of both take their defaults): it also checks that
// HeartbeatInterval is below the queue's LeaseDuration, or every lease would
// expire between two heartbeats.
func (c WorkerConfig) ValidateFor(queue Config) error {
	queue.setDefaults()
	c.setQueueDefaults(queue)
	errs := []error{c.Validate()}
	if c.HeartbeatInterval >= queue.LeaseDuration {
		errs = append(errs, fmt.Errorf("HeartbeatInterval %v: want below the queue's LeaseDuration (%v)",
			c.HeartbeatInterval, queue.LeaseDuration))
	}
	return errors.Join(errs...)
}
