package retry

import "errors"

type markedError struct{ err error }

func (e *markedError) Error() string { return e.err.Error() }
func (e *markedError) Unwrap() error { return e.err }

// Permanent marks err as one retrying cannot fix. Permanent(nil) is nil. The
// message is err's own: marking changes how the error is handled, not what it
// says.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &markedError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was marked
// permanent.
func IsPermanent(err error) bool {
	var m *markedError
	return errors.As(err, &m)
}
