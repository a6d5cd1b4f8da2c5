package outbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/retry"
)

// Dispatcher delivers one event to its destination. A nil error means
// delivered. Return retry.Permanent(err) (package pkg/retry) for errors
// that no retry can fix (invalid payload, unknown destination): the event
// goes to FAILED on this attempt. Return Unavailable(err) when the
// destination cannot be reached at all. Any other error is retried with
// backoff, and the event goes to FAILED at MaxAttempts.
type Dispatcher interface {
	Dispatch(ctx context.Context, ev Event) (Commit, error)
}

// DispatcherFunc adapts a function to Dispatcher.
type DispatcherFunc func(ctx context.Context, ev Event) (Commit, error)

// Dispatch calls f.
func (f DispatcherFunc) Dispatch(ctx context.Context, ev Event) (Commit, error) { return f(ctx, ev) }

// Commit runs inside the transaction that records the event as published
// (nil: nothing extra). The hand-off uses it to move the order to HANDED_OFF
// and record the waiting point atomically with that record. A Commit that
// fails leaves the event unpublished; the relay treats it as a transient
// failure, so it must be idempotent with respect to a redelivery of the same
// event.
type Commit func(ctx context.Context, tx pgx.Tx) error

type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return "dependency unavailable: " + e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// Unavailable marks err as "the dispatcher's dependency cannot be reached"
// (connection refused, gRPC UNAVAILABLE, no answer within the deadline): not
// the event's fault. The relay charges the event no attempt and no backoff
// for it, leaves the row as it was, and counts the failure against the
// dependency's circuit, which stops dispatching to it after a few in a row
// and probes it until it answers (circuit.go). Return it only for errors any
// event would get now; an error of this event's own making must stay
// transient (backoff, FAILED at MaxAttempts) or permanent (retry.Permanent).
// Unavailable(nil) is nil.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &unavailableError{err: err}
}

// IsUnavailable reports whether err (or an error it wraps) was marked
// Unavailable.
func IsUnavailable(err error) bool {
	var u *unavailableError
	return errors.As(err, &u)
}

// outcomeKind is what a dispatch made of its event; the settlement records
// it (settle.go, lease.go).
type outcomeKind int

const (
	outcomeReleased    outcomeKind = iota // not dispatched; left as it was
	outcomePublished                      // dispatched
	outcomeRetry                          // transient failure
	outcomeFailed                         // permanent failure
	outcomeUnavailable                    // dependency unavailable; left as it was, not charged
)

type outcome struct {
	kind   outcomeKind
	commit Commit
	err    error
}

// dispatchAll dispatches a claimed batch: aggregates in parallel (up to
// DispatchConcurrency), the events of one aggregate one after another in id
// order, stopping that aggregate at its first failure so that no later event
// overtakes it. ctx carries the cut-off, well before the claim transaction's
// deadline, so that a slow destination cannot outlive the claim.
func (r *Relay) dispatchAll(ctx context.Context, rows []claimedRow) []outcome {
	out := make([]outcome, len(rows))
	var groups [][]int
	byAgg := make(map[string]int, len(rows))
	for i, row := range rows { // rows are in id order
		g, ok := byAgg[row.ev.AggregateID]
		if !ok {
			g = len(groups)
			byAgg[row.ev.AggregateID] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	runGroup := func(g []int) {
		for _, i := range g {
			if ctx.Err() != nil {
				return // the rest stays outcomeReleased
			}
			out[i] = r.dispatchOne(ctx, rows[i].ev)
			if out[i].kind != outcomePublished {
				return
			}
		}
	}
	workers := min(r.cfg.DispatchConcurrency, len(groups))
	if workers <= 1 {
		for _, g := range groups {
			runGroup(g)
		}
		return out
	}
	// Workers take the next group by index: no channel hand-off per group.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for g := next.Add(1) - 1; g < int64(len(groups)); g = next.Add(1) - 1 {
				runGroup(groups[g])
			}
		})
	}
	wg.Wait()
	return out
}

func (r *Relay) dispatchOne(ctx context.Context, ev Event) (o outcome) {
	d, ok := r.dispatchers[ev.Type]
	if !ok {
		return outcome{kind: outcomeFailed, err: fmt.Errorf("no dispatcher for event type %q", ev.Type)}
	}
	c := r.circuits[ev.Type]
	if !c.Allow(r.now()) {
		return outcome{kind: outcomeReleased, err: errCircuitOpen}
	}
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("outbox dispatcher panicked", "event_id", ev.ID, "event_type", ev.Type, "panic", p, "stack", string(debug.Stack()))
			c.Success() // the event's fault, not the dependency's
			o = outcome{kind: outcomeRetry, err: fmt.Errorf("dispatcher panicked: %v", p)}
		}
	}()
	commit, err := d.Dispatch(ctx, ev)
	switch {
	case err == nil:
		c.Success()
		return outcome{kind: outcomePublished, commit: commit}
	case retry.IsPermanent(err):
		c.Success()
		// The prefix tells operators reading last_error (the runbook's
		// queries) a refusal from an exhausted retry or an unknown type.
		return outcome{kind: outcomeFailed, err: fmt.Errorf("permanent: %w", err)}
	case ctx.Err() != nil && (errors.Is(err, ctx.Err()) || IsUnavailable(err)):
		// Cut off by shutdown or the lease deadline: not the event's fault,
		// and it says nothing about the dependency.
		c.Abandon()
		return outcome{kind: outcomeReleased, err: err}
	case IsUnavailable(err):
		c.Failure(r.now())
		return outcome{kind: outcomeUnavailable, err: err}
	default:
		// The dependency answered; the error is this event's (backoff).
		c.Success()
		return outcome{kind: outcomeRetry, err: err}
	}
}

// errCircuitOpen is the outcome of an event not dispatched because its
// dependency's circuit is open (claimed before it opened, or with a probe).
var errCircuitOpen = errors.New("dependency circuit open")
