package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lossless-dev/lossless/pkg/retry"
)

// Disposition is what the relay does with an entry whose handler failed.
// Only "not yet waiting" heals with time; the other business
// rejections persist however often they are retried; technical failures heal
// with retry. See docs/adr/0008-error-classification-and-backoff.md.
type Disposition int

const (
	// Technical: back off with jitter and retry, without a count limit; the
	// age-of-oldest-open-entry alarm makes a long outage visible.
	Technical Disposition = iota
	// Deferred: a business rejection that time may cure (the order is not
	// waiting yet, F5; unknown order, F8). Back off until BOTH Config.MaxAttempts
	// and Config.MaxAge are reached, then park with the error's reason.
	Deferred
	// Parked: a business rejection no retry cures (ambiguous correlation, F7).
	Parked
	// Duplicate: the effect is already applied (F6). Resolved, no alarm.
	Duplicate
)

func (d Disposition) String() string {
	switch d {
	case Deferred:
		return "deferred"
	case Parked:
		return "parked"
	case Duplicate:
		return "duplicate"
	default:
		return "technical"
	}
}

// Classified is implemented by errors that are business outcomes rather than
// technical failures. Services define their own error types (one per
// rejection) implementing it; the relay finds them with errors.As.
type Classified interface {
	error
	// Disposition says how the relay treats the entry.
	Disposition() Disposition
	// Reason is the stable, upper-case park reason (metric label, runbooks).
	Reason() string
}

// ReasonPermanent parks an entry whose handler returned an error marked
// with retry.Permanent and no Classified rejection: a failure the handler
// knows retrying cannot fix (e.g. a stored payload it cannot decode).
const ReasonPermanent = "PERMANENT"

// Classify returns how err is handled and its park reason. A Classified
// error decides itself; an error marked permanent (pkg/retry) is Parked
// with ReasonPermanent; every other error, including database errors and
// timeouts, is Technical.
func Classify(err error) (Disposition, string) {
	var c Classified
	if errors.As(err, &c) {
		return c.Disposition(), c.Reason()
	}
	if retry.IsPermanent(err) {
		return Parked, ReasonPermanent
	}
	return Technical, ""
}

// RejectionError is a generic Classified error for services that need no
// type of their own.
type RejectionError struct {
	disposition Disposition
	reason      string
	Err         error
}

func (e *RejectionError) Error() string {
	return fmt.Sprintf("%s (%s): %v", e.reason, e.disposition, e.Err)
}
func (e *RejectionError) Unwrap() error            { return e.Err }
func (e *RejectionError) Disposition() Disposition { return e.disposition }
func (e *RejectionError) Reason() string           { return e.reason }

// Defer returns a rejection that may heal with time (see Deferred).
func Defer(reason string, err error) error {
	return &RejectionError{disposition: Deferred, reason: reason, Err: err}
}

// Park returns a rejection that parks the entry at once.
func Park(reason string, err error) error {
	return &RejectionError{disposition: Parked, reason: reason, Err: err}
}

// AlreadyApplied returns the outcome of a recognised duplicate.
func AlreadyApplied(err error) error {
	return &RejectionError{disposition: Duplicate, reason: "DUPLICATE", Err: err}
}

// outcome classifies the handler's result for e (nil = applied).
func (r *Relay) outcome(ctx context.Context, e *Entry, herr error) outcome {
	o := outcome{id: e.ID, attempts: e.Attempts + 1, receivedAt: e.ReceivedAt}
	if herr == nil {
		o.status = StatusApplied
		return o
	}
	msg := herr.Error()
	o.lastError = &msg
	if pe := (*panicError)(nil); errors.As(herr, &pe) {
		// A panic is no business outcome and may not heal: retried like a
		// technical failure, but parked once MaxAttempts is reached.
		o.disposition, o.panicked = Technical, true
		if o.attempts >= r.cfg.MaxAttempts {
			reason := ReasonPanic
			o.status, o.parkReason = StatusParked, &reason
			r.logger.ErrorContext(ctx, "inbox relay: entry parked after repeated panics", "inbox_id", e.ID, "event_id", e.EventID,
				"event_type", e.EventType, "correlation_key", e.CorrelationKey, "attempts", o.attempts, "error", msg)
		} else {
			o.status, o.delay = StatusOpen, r.cfg.TechnicalBackoff.Delay(o.attempts)
		}
		return o
	}
	d, reason := Classify(herr)
	o.disposition = d
	switch d {
	case Duplicate:
		o.status = StatusDuplicate
	case Parked:
		o.status, o.parkReason = StatusParked, &reason
	case Deferred:
		if o.attempts >= r.cfg.MaxAttempts && time.Since(e.ReceivedAt) >= r.cfg.MaxAge {
			o.status, o.parkReason = StatusParked, &reason
		} else {
			o.status, o.delay = StatusOpen, r.cfg.DeferBackoff.Delay(o.attempts)
		}
	default:
		o.status, o.delay = StatusOpen, r.cfg.TechnicalBackoff.Delay(o.attempts)
		r.logger.WarnContext(ctx, "inbox relay: technical failure; will retry",
			"inbox_id", e.ID, "event_id", e.EventID, "attempts", o.attempts, "error", herr)
	}
	if o.status == StatusParked {
		r.logger.ErrorContext(ctx, "inbox relay: entry parked", "inbox_id", e.ID, "event_id", e.EventID,
			"event_type", e.EventType, "correlation_key", e.CorrelationKey, "reason", reason, "error", herr)
	}
	return o
}

// outcome is one claimed entry's resolution.
type outcome struct {
	id          int64
	status      Status
	attempts    int
	delay       time.Duration
	lastError   *string
	parkReason  *string
	disposition Disposition
	panicked    bool
	receivedAt  time.Time
}

// batchFailedError is a HandleBatch failure: the batch is retried entry by
// entry in a new transaction.
type batchFailedError struct{ err error }

func (e *batchFailedError) Error() string { return "inbox: batch handler: " + e.err.Error() }
func (e *batchFailedError) Unwrap() error { return e.err }
