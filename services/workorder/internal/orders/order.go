package orders

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
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

// Money is an amount in a currency's minor unit.
type Money struct {
	CurrencyCode string
	MinorUnits   int64
}

// Order is one work order. Its status, completed items, job id, invoice id
// and waiting points change only through its methods, which follow the
// lifecycle table (package comment); TxRepository.Save writes what they
// recorded.
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
	// CreatedBy is the authenticated caller that created the order (its
	// token's subject; "" for orders from before authentication). Set by
	// the caller of New, never changed.
	CreatedBy string
	// Version is incremented by every saved change of the row.
	Version   int64
	CreatedAt time.Time
	UpdatedAt time.Time

	// open are the ids of the order's open waiting points, oldest first,
	// read under the row lock by TxRepository.Lock (empty in orders read
	// without it) and kept current by Save.
	open []int64
	// Changes made since the order was loaded, written by the repository in
	// the same transaction as the order row.
	rowChanged    bool
	transitions   []Transition
	waitingPoints []WaitingPoint
	consumed      []consumption
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
	// ProviderJobID is empty for an operator's re-hand-off.
	ProviderJobID string
	Cause         string
}

type consumption struct {
	waitingPoint int64
	cause        string
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
	if err := o.transition(OpCreate, StatusCreated, CauseCreate); err != nil {
		return Order{}, err
	}
	return o, nil
}

// OpenWaitingPoints returns the ids of the order's open waiting points,
// oldest first, as read under the row lock and changed since.
func (o *Order) OpenWaitingPoints() []int64 { return append([]int64(nil), o.open...) }

// Cancel cancels an order that has not been handed off. Cancelling a
// cancelled order changes nothing and succeeds (a retried cancel is not an
// error). Any later status is an *IllegalTransitionError: the provider has
// the work.
func (o *Order) Cancel(reason string) error {
	if o.Status == StatusCancelled {
		return nil
	}
	cause := CauseCancel
	if reason != "" {
		cause += ": " + reason
	}
	return o.transition(OpCancel, StatusCancelled, cause)
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
		_ = o.transition(OpAcceptHandOff, StatusHandedOff, CauseHandOffAccepted+detail) // legal from CREATED
		o.waitingPoints = append(o.waitingPoints, WaitingPoint{ProviderJobID: jobID, Cause: CauseHandOffAccepted + detail})
		return HandedOff
	case StatusCancelled:
		// Recorded once, however often the event is dispatched again.
		if o.ProviderJobID == "" {
			o.ProviderJobID, o.rowChanged = jobID, true
			_ = o.transition(OpHandOffAfterCancel, StatusCancelled, CauseHandOffAfterCancel+detail) // legal from CANCELLED
		}
		return AcceptedAfterCancel
	default:
		return AlreadyHandedOff
	}
}

// RecordExecutionStarted records in the history that the provider started
// the work; the status stays. A HANDED_OFF order must wait on exactly one
// open waiting point (*WaitingPointError); CREATED and CANCELLED orders are
// not being worked on (*IllegalTransitionError).
func (o *Order) RecordExecutionStarted(cause string) error {
	if err := check(o.ID, OpStart, o.Status, o.Status); err != nil {
		return err
	}
	if o.Status == StatusHandedOff {
		if _, err := o.waitingPoint(); err != nil {
			return err
		}
	}
	return o.transition(OpStart, o.Status, cause)
}

// Complete applies a completion tranche of items (F14: an order may complete
// in several). The tranche that reaches the positions completes the order
// (HANDED_OFF -> COMPLETED, history cause as given) and consumes its waiting
// point; a shorter one adds its items and is recorded with cause
// "<cause>:tranche <completed>/<positions>". Checked in this order: the
// status (*IllegalTransitionError), the waiting point (*WaitingPointError),
// the positions (*ExcessItemsError). An error changes nothing.
func (o *Order) Complete(items int32, cause string) (completed bool, err error) {
	if items < 1 {
		return false, fmt.Errorf("work order %s: tranche of %d items: want at least 1", o.ID, items)
	}
	total := o.CompletedItems + items
	op, to := OpTranche, StatusHandedOff
	if total >= o.Positions {
		op, to = OpComplete, StatusCompleted
	}
	if err := check(o.ID, op, o.Status, to); err != nil {
		return false, err
	}
	wp, err := o.waitingPoint()
	if err != nil {
		return false, err
	}
	if total > o.Positions {
		return false, &ExcessItemsError{ID: o.ID, Positions: o.Positions, Completed: o.CompletedItems, Items: items}
	}
	o.CompletedItems, o.rowChanged = total, true
	if op == OpTranche {
		return false, o.transition(op, to, fmt.Sprintf("%s:tranche %d/%d", cause, total, o.Positions))
	}
	o.consumed = append(o.consumed, consumption{waitingPoint: wp, cause: cause})
	return true, o.transition(op, to, cause)
}

// ReHandOff records one more open waiting point for a HANDED_OFF order, as
// an operator's manual re-hand-off does. With two open waiting points the
// provider's next report is ambiguous and is parked (F7): the repair is
// visible, not guessed.
func (o *Order) ReHandOff(cause string) error {
	if err := o.transition(OpReHandOff, StatusHandedOff, cause); err != nil {
		return err
	}
	o.waitingPoints = append(o.waitingPoints, WaitingPoint{Cause: cause})
	return nil
}

// InvoiceOutcome is what invoicing did to the order.
type InvoiceOutcome int

const (
	// Invoiced: COMPLETED -> INVOICED, invoice id set.
	Invoiced InvoiceOutcome = iota + 1
	// AlreadyInvoiced: the order is INVOICED with this very invoice (the
	// invoice announced again); nothing changes.
	AlreadyInvoiced
)

// Invoice records the order's invoice. An INVOICED order with another
// invoice is a *SecondInvoiceError; any status but COMPLETED and INVOICED an
// *IllegalTransitionError.
func (o *Order) Invoice(invoiceID uuid.UUID, cause string) (InvoiceOutcome, error) {
	if o.Status == StatusInvoiced {
		if o.InvoiceID == invoiceID.String() {
			return AlreadyInvoiced, nil
		}
		return 0, &SecondInvoiceError{ID: o.ID, Current: o.InvoiceID, Got: invoiceID.String()}
	}
	if err := check(o.ID, OpInvoice, o.Status, StatusInvoiced); err != nil {
		return 0, err
	}
	o.InvoiceID = invoiceID.String()
	return Invoiced, o.transition(OpInvoice, StatusInvoiced, cause)
}

// waitingPoint returns the single open waiting point.
func (o *Order) waitingPoint() (int64, error) {
	if len(o.open) != 1 {
		return 0, &WaitingPointError{ID: o.ID, Status: o.Status, Open: o.OpenWaitingPoints()}
	}
	return o.open[0], nil
}

// transition checks op against the lifecycle table and records it.
func (o *Order) transition(op Op, to Status, cause string) error {
	if err := check(o.ID, op, o.Status, to); err != nil {
		return err
	}
	o.transitions = append(o.transitions, Transition{From: o.Status, To: to, Cause: cause})
	if to != o.Status {
		o.Status, o.rowChanged = to, true
	}
	return nil
}

func (o *Order) changed() bool { return len(o.transitions) > 0 }
