package leasequeue

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// State of a job. available → running → done; running → available (retry
// after a backoff, or release on shutdown); running → dead (permanent error,
// attempts exhausted, or lease expired on the last attempt); dead → available
// only through Retry (an audited operator action).
type State string

// Job states, as stored in leasequeue_jobs.state.
const (
	StateAvailable State = "available"
	StateRunning   State = "running"
	StateDone      State = "done"
	StateDead      State = "dead"
)

// NewJob is a job to enqueue.
type NewJob struct {
	// UniqueKey is the job's business identity: a second job with the same key
	// in the same queue is not inserted. Empty: no identity, always inserted.
	UniqueKey string
	// Payload is the handler's input, opaque to the queue.
	Payload []byte
	// MaxAttempts bounds the claims of the job; 0 means DefaultMaxAttempts.
	MaxAttempts int
	// RunAt delays the first claim; zero means now.
	RunAt time.Time
	// Traceparent and Tracestate are the W3C trace context of the operation
	// that enqueued the job (telemetry.TraceHeaders(ctx)); each attempt's
	// span links to it. Empty: no link.
	Traceparent, Tracestate string
}

// DefaultMaxAttempts is the attempt budget of a job enqueued without one:
// with the default backoff (1s base, 5m cap) it spans roughly half an hour of
// retries, enough to outlast a database failover or a deploy.
const DefaultMaxAttempts = 10

// cleanupTimeout bounds a rollback or a close that runs after its caller's
// context ended, on a connection that may be dead (a half-open connection
// answers nothing; without a deadline the wait ends only when TCP gives up).
const cleanupTimeout = 5 * time.Second

// Job is a claimed job: the holder's view, fenced by Epoch.
type Job struct {
	ID        int64
	UniqueKey string
	Payload   []byte
	// Attempt is this claim's number, 1-based.
	Attempt     int
	MaxAttempts int
	// Epoch is the fencing token of this claim; every write checks it.
	Epoch     int64
	Owner     string
	CreatedAt time.Time
	// Traceparent and Tracestate: the enqueuer's trace context (NewJob).
	Traceparent, Tracestate string
}

// Complete holds a job's transactional effects. It runs inside the
// transaction that marks the job done, after the fencing check passed, so the
// effects commit if and only if this claim still owns the job. It may be run
// more than once (a batch that fails is retried job by job) and must have no
// effect outside tx.
type Complete func(ctx context.Context, tx pgx.Tx) error

// Handler does a job's work outside any transaction and returns its
// transactional effects (nil: none). An error fails the attempt: the job is
// retried after a backoff, or parked when the error is marked permanent
// (retry.Permanent) or the attempts are exhausted. ctx is cancelled when the
// lease is lost or the worker's shutdown grace runs out.
type Handler func(ctx context.Context, job Job) (Complete, error)

// ErrLeaseLost is returned when a fenced write found the job no longer held
// by this claim: its lease expired and another worker claimed it, or it was
// finished by someone else. Nothing was written.
var ErrLeaseLost = errors.New("leasequeue: lease lost: job no longer held by this claim (stale fencing token)")
