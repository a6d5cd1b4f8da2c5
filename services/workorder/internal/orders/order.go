// Package orders is the work order: its lifecycle rules (order.go) and its
// PostgreSQL repository (repository.go). It knows nothing of gRPC, the outbox
// relay or the provider; the API and the hand-off dispatcher call it.
//
// Lifecycle: CREATED -> HANDED_OFF -> COMPLETED -> INVOICED, or CREATED ->
// CANCELLED. Every status change is recorded as a Transition with its cause.
package orders

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Status is a work order's lifecycle state, stored as its name.
type Status string

// The statuses; the CHECK constraint on work_orders.status lists the same.
const (
	StatusCreated   Status = "CREATED"
	StatusHandedOff Status = "HANDED_OFF"
	StatusCompleted Status = "COMPLETED"
	StatusInvoiced  Status = "INVOICED"
	StatusCancelled Status = "CANCELLED"
)

// Causes of transitions written by this service's API and hand-off.
const (
	CauseCreate          = "api:create"
	CauseCancel          = "api:cancel"
	CauseHandOffAccepted = "outbox:handoff-accepted"
	// CauseHandOffAfterCancel records that the provider accepted an order
	// that had been cancelled while its hand-off was in flight.
	CauseHandOffAfterCancel = "outbox:handoff-accepted-after-cancel"
)

// AggregateType is the outbox aggregate type of work order events.
const AggregateType = "work_order"

// ErrNotFound: no work order has the id.
var ErrNotFound = errors.New("work order not found")

// StateError reports an operation the order's current status does not allow.
type StateError struct {
	ID     uuid.UUID
	Status Status
	Op     string
}

func (e *StateError) Error() string {
	return fmt.Sprintf("work order %s is %s: cannot %s", e.ID, e.Status, e.Op)
}

// Money is an amount in a currency's minor unit.
type Money struct {
	CurrencyCode string
	MinorUnits   int64
}

// Order is one work order.
type Order struct {
	ID             uuid.UUID
	CustomerID     string
	Description    string
	Positions      int32
	UnitPrice      Money
	Status         Status
	CompletedItems int32
	ProviderJobID  string
	InvoiceID      string
	// Version is incremented by every saved change.
	Version   int64
	CreatedAt time.Time
	UpdatedAt time.Time

	// Changes made since the order was loaded, written by the repository in
	// the same transaction as the order row.
	transitions   []Transition
	waitingPoints []WaitingPoint
}

// Transition is one entry of an order's history.
type Transition struct {
	// From is empty for the order's first transition.
	From  Status
	To    Status
	Cause string
	At    time.Time
}

// WaitingPoint is the explicit record that the order waits for the
// provider's completion; correlation consumes it.
type WaitingPoint struct {
	ProviderJobID string
	Cause         string
}

// New returns a CREATED order with a fresh time-ordered id (UUIDv7, so new
// rows land at the right edge of the primary key index). Field rules are
// checked by the API's validation and again by the table's CHECK constraints.
func New(customerID, description string, positions int32, unitPrice Money) (Order, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return Order{}, fmt.Errorf("new work order id: %w", err)
	}
	o := Order{
		ID:          id,
		CustomerID:  customerID,
		Description: description,
		Positions:   positions,
		UnitPrice:   unitPrice,
	}
	o.transition(StatusCreated, CauseCreate)
	return o, nil
}

// Cancel cancels an order that has not been handed off. Cancelling a
// cancelled order changes nothing and succeeds (a retried cancel is not an
// error). Any later status is a *StateError: the provider has the work.
func (o *Order) Cancel(reason string) error {
	switch o.Status {
	case StatusCancelled:
		return nil
	case StatusCreated:
		cause := CauseCancel
		if reason != "" {
			cause += ": " + reason
		}
		o.transition(StatusCancelled, cause)
		return nil
	default:
		return &StateError{ID: o.ID, Status: o.Status, Op: "cancel"}
	}
}

// HandOffOutcome is what accepting a hand-off did to the order.
type HandOffOutcome int

const (
	// HandedOff: CREATED -> HANDED_OFF, job id set, waiting point recorded.
	HandedOff HandOffOutcome = iota + 1
	// AcceptedAfterCancel: the order was cancelled while the provider call
	// was in flight. It stays CANCELLED (the client was told so and billing
	// must never invoice it); the job id and a history entry record that the
	// provider accepted the work anyway, and no waiting point is created, so
	// the provider's completion is rejected by correlation and surfaces there.
	AcceptedAfterCancel
	// AlreadyHandedOff: a repeated acceptance (the event was dispatched
	// again after a crash or a replay); nothing changes.
	AlreadyHandedOff
)

// AcceptHandOff records the provider's acceptance of the order as job jobID,
// in answer to the hand-off event eventID (both named in the history entry).
func (o *Order) AcceptHandOff(jobID, eventID string) HandOffOutcome {
	detail := " job=" + jobID + " event=" + eventID
	switch o.Status {
	case StatusCreated:
		o.ProviderJobID = jobID
		o.transition(StatusHandedOff, CauseHandOffAccepted+detail)
		o.waitingPoints = append(o.waitingPoints, WaitingPoint{ProviderJobID: jobID, Cause: CauseHandOffAccepted + detail})
		return HandedOff
	case StatusCancelled:
		// Recorded once, however often the event is dispatched again.
		if o.ProviderJobID == "" {
			o.ProviderJobID = jobID
			o.transitions = append(o.transitions, Transition{From: StatusCancelled, To: StatusCancelled, Cause: CauseHandOffAfterCancel + detail})
		}
		return AcceptedAfterCancel
	default:
		return AlreadyHandedOff
	}
}

func (o *Order) transition(to Status, cause string) {
	o.transitions = append(o.transitions, Transition{From: o.Status, To: to, Cause: cause})
	o.Status = to
}

func (o *Order) changed() bool { return len(o.transitions) > 0 || len(o.waitingPoints) > 0 }
