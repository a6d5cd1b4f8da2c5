package correlation

import (
	"fmt"

	"github.com/lossless-dev/lossless/pkg/inbox"
)

// Park reasons of the work-order correlation (metric label inbox.parked_entries{reason},
// runbooks). inbox.ReasonPoison covers undecodable payloads.
const (
	ReasonNotWaiting     = "NOT_WAITING"
	ReasonUnknownOrder   = "UNKNOWN_ORDER"
	ReasonAmbiguous      = "AMBIGUOUS"
	ReasonOverCompletion = "OVER_COMPLETION"
	ReasonOrderCancelled = "ORDER_CANCELLED"
)

// The four ways a correlation rejects a completion, as their own types, so
// that business and technical errors do not blur (ADR 0008). The fourth,
// "the waiting point vanished between query and delivery", has no type: it
// cannot happen here. The correlation locks the order row and its
// open waiting points FOR UPDATE and consumes the waiting point in the same
// transaction that read it, so no one can consume or remove it in between;
// a concurrent correlation of the same order waits for the lock and then sees
// the order COMPLETED (TestConcurrentRelaysCannotBothConsumeOneWaitingPoint).

// NotWaitingError: the order exists but has no waiting point yet (F5: the
// completion overtook the hand-off). Time may cure it: Deferred.
type NotWaitingError struct {
	OrderID string
	Status  string
}

func (e *NotWaitingError) Error() string {
	return fmt.Sprintf("work order %s is not waiting for completion (status %s)", e.OrderID, e.Status)
}
func (e *NotWaitingError) Disposition() inbox.Disposition { return inbox.Deferred }
func (e *NotWaitingError) Reason() string                 { return ReasonNotWaiting }

// UnknownOrderError: no such order (F8). It may still be created (a replica
// lagging, a restore); after the deadline it is parked: Deferred.
type UnknownOrderError struct{ OrderID string }

func (e *UnknownOrderError) Error() string                  { return fmt.Sprintf("unknown work order %s", e.OrderID) }
func (e *UnknownOrderError) Disposition() inbox.Disposition { return inbox.Deferred }
func (e *UnknownOrderError) Reason() string                 { return ReasonUnknownOrder }

// AlreadyAppliedError: this exact business event (source + event id) was
// already applied to the order (F6: redelivered or late). Not an alarm.
type AlreadyAppliedError struct {
	OrderID, EventID string
}

func (e *AlreadyAppliedError) Error() string {
	return fmt.Sprintf("event %s already applied to work order %s", e.EventID, e.OrderID)
}
func (e *AlreadyAppliedError) Disposition() inbox.Disposition { return inbox.Duplicate }
func (e *AlreadyAppliedError) Reason() string                 { return "DUPLICATE" }

// AmbiguousError: more than one open waiting point (F7, e.g. after a manual
// re-hand-off). No retry helps; a person decides: Parked.
type AmbiguousError struct {
	OrderID       string
	WaitingPoints []int64
}

func (e *AmbiguousError) Error() string {
	return fmt.Sprintf("work order %s has %d open waiting points %v: ambiguous correlation", e.OrderID, len(e.WaitingPoints), e.WaitingPoints)
}
func (e *AmbiguousError) Disposition() inbox.Disposition { return inbox.Parked }
func (e *AmbiguousError) Reason() string                 { return ReasonAmbiguous }

// OverCompletionError: a NEW tranche (not a duplicate) would push completed
// items past the order's positions, e.g. a tranche for an order already
// completed. A provider inconsistency: Parked.
type OverCompletionError struct {
	OrderID                         string
	Positions, Completed, Increment int
}

func (e *OverCompletionError) Error() string {
	return fmt.Sprintf("work order %s: tranche of %d items would exceed its positions (%d of %d already completed)",
		e.OrderID, e.Increment, e.Completed, e.Positions)
}
func (e *OverCompletionError) Disposition() inbox.Disposition { return inbox.Parked }
func (e *OverCompletionError) Reason() string                 { return ReasonOverCompletion }

// OrderCancelledError: the order was cancelled, yet the provider reports on
// it. Parked.
type OrderCancelledError struct{ OrderID string }

func (e *OrderCancelledError) Error() string {
	return fmt.Sprintf("work order %s is cancelled", e.OrderID)
}
func (e *OrderCancelledError) Disposition() inbox.Disposition { return inbox.Parked }
func (e *OrderCancelledError) Reason() string                 { return ReasonOrderCancelled }
