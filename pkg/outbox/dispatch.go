package outbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// Dispatcher delivers one event to its destination. A nil error means
// delivered. Return Permanent(err) for errors that no retry can fix (invalid
// payload, unknown destination) and Unavailable(err) when the destination
// cannot be reached at all; any other error is retried with backoff.
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

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as not retryable: the event goes to FAILED (counted,
// alerted) on this attempt. Any other error is transient. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err (or an error it wraps) was marked Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

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
// transient (backoff, FAILED at MaxAttempts) or Permanent.
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
