// Package permanent is the one way, across every retrying loop of this
// repository (outbox relay, inbox relay, lease-queue worker, consumers), to
// say "retrying cannot fix this": the loop records the failure at once
// (FAILED, parked, dead) instead of spending attempts and backoff on it.
//
// Any error not marked is transient. Whether an error is permanent is the
// caller's judgement: a decode error of a stored payload is, a refused
// connection is not (pkg/pgdb classifies database errors).
package permanent

import "errors"

type markedError struct{ err error }

func (e *markedError) Error() string { return e.err.Error() }
func (e *markedError) Unwrap() error { return e.err }

// Mark wraps err as permanent. Mark(nil) is nil. The message is err's own:
// marking changes how the error is handled, not what it says.
func Mark(err error) error {
	if err == nil {
		return nil
	}
	return &markedError{err: err}
}

// Is reports whether err, or any error it wraps, was marked permanent.
func Is(err error) bool {
	var m *markedError
	return errors.As(err, &m)
}
