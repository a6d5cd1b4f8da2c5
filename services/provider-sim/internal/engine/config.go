package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// Environment variables read by ConfigFromEnv.
const (
	EnvWorkers         = "PROVIDER_WORKERS"
	EnvPollInterval    = "PROVIDER_POLL_INTERVAL"
	EnvLease           = "PROVIDER_LEASE"
	EnvExecBase        = "PROVIDER_EXEC_BASE"
	EnvExecPerPosition = "PROVIDER_EXEC_PER_POSITION"
	EnvExecJitter      = "PROVIDER_EXEC_JITTER"
	EnvRetryBase       = "PROVIDER_RETRY_BASE"
	EnvRetryMax        = "PROVIDER_RETRY_MAX"
	EnvInstance        = "INSTANCE_ID"
)

// Config tunes execution. The zero value of a field means its default.
type Config struct {
	// Workers is the number of jobs executed at once: the provider's capacity.
	// A job holds its worker while it "executes". Default 32.
	Workers int
	// PollInterval: an idle worker looks for claimable jobs this often (a
	// submission on this instance wakes one at once). Default 500ms.
	PollInterval time.Duration
	// Lease: a claimed job belongs to its worker this long; the worker renews
	// it every Lease/3 while it runs. After a crash, another worker (or the
	// restarted process) takes the job over once the lease has expired.
	// Default 15s.
	Lease time.Duration
	// ExecBase is the fixed part of every job's execution time. Default 1s.
	ExecBase time.Duration
	// ExecPerPosition is added per position of the work order. Default 2ms.
	ExecPerPosition time.Duration
	// ExecJitter scales the execution time by a uniform factor in
	// [1-ExecJitter, 1+ExecJitter], within [0, 1]. Default 0.2. (0 cannot be
	// told apart from unset; set NoJitter for exact times.)
	ExecJitter float64
	// NoJitter forces ExecJitter to 0 (tests).
	NoJitter bool
	// Retry spaces the attempts of a job whose publish failed (Pub/Sub
	// unavailable, F16). Default base 500ms, max 30s, full jitter.
	Retry retry.Backoff
	// Instance is this process's identity across restarts (a pod or replica
	// name, "provider-sim-1"). When set, Owner is "<Instance>/<pid>-<random>"
	// and Run first releases the jobs an earlier incarnation of the instance
	// still holds (owners "<Instance>/…" other than Owner), under a new
	// fencing token: a restarted process resumes its dead predecessor's jobs
	// at once instead of after their lease. Leases of other instances still
	// wait for expiry. Must be unique among live instances sharing the
	// database; 1..100 letters, digits, '.', '_' or '-'. Default "": no
	// release at start.
	Instance string
	// Owner names this process in lease_owner, unique per start. Default
	// "<hostname>-<pid>-<random>" ("<Instance>/<pid>-<random>" with Instance;
	// an explicit Owner must then start with "<Instance>/").
	Owner string
	// Crash is called by the publish_then_crash fault right after the publish
	// and before it is recorded. Default (nil): the process exits with status 3.
	// Tests inject a function that stops the engine instead; the engine then
	// abandons the job exactly as a dead process would (no record, no release).
	Crash func()
}

// ConfigFromEnv reads the config; parse errors are collected in env.
func ConfigFromEnv(env *envconfig.Reader) Config {
	return Config{
		Workers:         env.Int(EnvWorkers, 32),
		PollInterval:    env.Duration(EnvPollInterval, 500*time.Millisecond),
		Lease:           env.Duration(EnvLease, 15*time.Second),
		ExecBase:        env.Duration(EnvExecBase, time.Second),
		ExecPerPosition: env.Duration(EnvExecPerPosition, 2*time.Millisecond),
		ExecJitter:      env.Float(EnvExecJitter, 0.2),
		Retry: retry.Backoff{
			Base: env.Duration(EnvRetryBase, 500*time.Millisecond),
			Max:  env.Duration(EnvRetryMax, 30*time.Second),
		},
		Instance: env.String(EnvInstance, ""),
	}
}

func (c *Config) setDefaults() {
	if c.Workers == 0 {
		c.Workers = 32
	}
	if c.PollInterval == 0 {
		c.PollInterval = 500 * time.Millisecond
	}
	if c.Lease == 0 {
		c.Lease = 15 * time.Second
	}
	if c.ExecBase == 0 && c.ExecPerPosition == 0 {
		c.ExecBase, c.ExecPerPosition = time.Second, 2*time.Millisecond
	}
	if c.ExecJitter == 0 && !c.NoJitter {
		c.ExecJitter = 0.2
	}
	if c.NoJitter {
		c.ExecJitter = 0
	}
	if c.Retry.Base == 0 {
		c.Retry.Base = 500 * time.Millisecond
	}
	if c.Retry.Max == 0 {
		c.Retry.Max = 30 * time.Second
	}
}

// Validate reports settings that cannot work, naming their variables.
// Zero fields are valid: they take the defaults.
func (c Config) Validate() error {
	var errs []error
	check := func(name string, bad bool, msg string) {
		if bad {
			errs = append(errs, envconfig.Check(name, errors.New(msg)))
		}
	}
	check(EnvWorkers, c.Workers < 0 || c.Workers > 10_000, fmt.Sprintf("must be within [1, 10000], got %d", c.Workers))
	check(EnvPollInterval, c.PollInterval < 0, "must not be negative")
	check(EnvLease, c.Lease < 0 || (c.Lease > 0 && c.Lease < 30*time.Millisecond), "must be at least 30ms")
	check(EnvExecBase, c.ExecBase < 0, "must not be negative")
	check(EnvExecPerPosition, c.ExecPerPosition < 0, "must not be negative")
	check(EnvExecJitter, !(c.ExecJitter >= 0 && c.ExecJitter <= 1), fmt.Sprintf("must be within [0, 1], got %v", c.ExecJitter))
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, envconfig.Check(EnvRetryBase+"/"+EnvRetryMax, err))
	}
	if err := errors.Join(leasequeue.ValidateInstance(c.Instance), leasequeue.ValidateOwner(c.Owner, c.Instance)); err != nil {
		errs = append(errs, envconfig.Check(EnvInstance, err))
	}
	return errors.Join(errs...)
}
