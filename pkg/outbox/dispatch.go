package outbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
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
