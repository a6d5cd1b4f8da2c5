// Package orders is the work order: its lifecycle (lifecycle.go), the
// operations that move it (order.go) and its PostgreSQL repository
// (repository.go). It is the only code that writes a work order's status, its
// history (work_order_transitions) or its waiting points; the API, the
// hand-off dispatcher, the correlation, the invoicing consumer and the
// operator tools all go through it. It knows nothing of gRPC, the outbox
// relay or the provider.
//
// # Lifecycle
//
// Each operation is a method of Order that checks the table below against
// the order's current status and either records the change (applied by
// TxRepository.Save, in the caller's transaction) or returns an
// *IllegalTransitionError (errors.Is ErrIllegalTransition) and changes
// nothing. Rules returns the table; CheckTransition answers for a status
// pair. A row whose From equals its To changes no status: it is a history
// entry only.
//
//	operation                       from        to          also writes
//	create                          (none)      CREATED     row, hand-off outbox event
//	accept hand-off                 CREATED     HANDED_OFF  job id, open waiting point
//	accept hand-off after cancel    CANCELLED   CANCELLED   job id (once)
//	cancel                          CREATED     CANCELLED
//	record execution start          HANDED_OFF  HANDED_OFF  (needs one open waiting point)
//	record execution start          COMPLETED   COMPLETED
//	record execution start          INVOICED    INVOICED
//	apply completion tranche        HANDED_OFF  HANDED_OFF  completed items (tranche short of positions)
//	complete                        HANDED_OFF  COMPLETED   completed items, consumes the waiting point
//	re-hand-off (operator)          HANDED_OFF  HANDED_OFF  one more open waiting point (F7)
//	invoice                         COMPLETED   INVOICED    invoice id
//
// Every row writes one work_order_transitions entry with its cause. Repeats
// are not transitions and write nothing: cancelling a CANCELLED order,
// accepting a hand-off already accepted (HANDED_OFF, COMPLETED, INVOICED, or
// CANCELLED with its job id recorded), invoicing an INVOICED order with the
// same invoice. Everything else is illegal. There is no FAILED status: a
// hand-off the provider refuses stays CREATED and its outbox event FAILED.
package orders

import (
	"errors"
	"fmt"

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

// Statuses lists every status in lifecycle order.
func Statuses() []Status {
	return []Status{StatusCreated, StatusHandedOff, StatusCompleted, StatusInvoiced, StatusCancelled}
}

// Op names an operation of the lifecycle table.
type Op string

// The operations.
const (
	OpCreate             Op = "create"
	OpAcceptHandOff      Op = "accept hand-off"
	OpHandOffAfterCancel Op = "accept hand-off after cancel"
	OpCancel             Op = "cancel"
	OpStart              Op = "record execution start"
	OpTranche            Op = "apply completion tranche"
	OpComplete           Op = "complete"
	OpReHandOff          Op = "re-hand-off"
	OpInvoice            Op = "invoice"
)

// Rule is one row of the lifecycle table.
type Rule struct {
	Op       Op
	From, To Status
}

// Rules returns the lifecycle table (see the package comment).
func Rules() []Rule {
	return []Rule{
		{OpCreate, "", StatusCreated},
		{OpAcceptHandOff, StatusCreated, StatusHandedOff},
		{OpHandOffAfterCancel, StatusCancelled, StatusCancelled},
		{OpCancel, StatusCreated, StatusCancelled},
		{OpStart, StatusHandedOff, StatusHandedOff},
		{OpStart, StatusCompleted, StatusCompleted},
		{OpStart, StatusInvoiced, StatusInvoiced},
		{OpTranche, StatusHandedOff, StatusHandedOff},
		{OpComplete, StatusHandedOff, StatusCompleted},
		{OpReHandOff, StatusHandedOff, StatusHandedOff},
		{OpInvoice, StatusCompleted, StatusInvoiced},
	}
}

// CheckTransition returns nil if some operation of the table moves an order
// from from to to ("" is before creation), else an *IllegalTransitionError.
func CheckTransition(from, to Status) error {
	for _, r := range Rules() {
		if r.From == from && r.To == to {
			return nil
		}
	}
	return &IllegalTransitionError{From: from, To: to}
}

// check returns nil if op may move an order from from to to.
func check(id uuid.UUID, op Op, from, to Status) error {
	for _, r := range Rules() {
		if r.Op == op && r.From == from && r.To == to {
			return nil
		}
	}
	return &IllegalTransitionError{ID: id, Op: op, From: from, To: to}
}

// ErrIllegalTransition matches every *IllegalTransitionError (errors.Is).
var ErrIllegalTransition = errors.New("illegal work order transition")

// IllegalTransitionError reports an operation the order's status does not
// allow. The order is unchanged.
type IllegalTransitionError struct {
	ID uuid.UUID
	// Op is empty when the error answers CheckTransition.
	Op       Op
	From, To Status
}

func (e *IllegalTransitionError) Error() string {
	if e.Op == "" {
		return fmt.Sprintf("illegal work order transition %q -> %q", e.From, e.To)
	}
	// The API returns this text to clients (FAILED_PRECONDITION).
	return fmt.Sprintf("work order %s is %s: cannot %s", e.ID, e.From, e.Op)
}

// Is makes errors.Is(err, ErrIllegalTransition) true.
func (e *IllegalTransitionError) Is(target error) bool { return target == ErrIllegalTransition }

// WaitingPointError: a HANDED_OFF order must wait on exactly one open
// waiting point for the provider's report to apply. None: the hand-off is
// not recorded yet, or the point was consumed. More than one: a manual
// re-hand-off made the report ambiguous (F7); a person decides.
type WaitingPointError struct {
	ID     uuid.UUID
	Status Status
	// Open lists the open waiting points, oldest first.
	Open []int64
}

func (e *WaitingPointError) Error() string {
	if len(e.Open) == 0 {
		return fmt.Sprintf("work order %s is %s without an open waiting point", e.ID, e.Status)
	}
	return fmt.Sprintf("work order %s has %d open waiting points %v", e.ID, len(e.Open), e.Open)
}

// ExcessItemsError: a completion tranche would push the completed items
// past the order's positions.
type ExcessItemsError struct {
	ID                          uuid.UUID
	Positions, Completed, Items int32
}

func (e *ExcessItemsError) Error() string {
	return fmt.Sprintf("work order %s: tranche of %d items would exceed its positions (%d of %d already completed)",
		e.ID, e.Items, e.Completed, e.Positions)
}

// SecondInvoiceError: an INVOICED order is invoiced again under another
// invoice (I3 broken upstream).
type SecondInvoiceError struct {
	ID uuid.UUID
	// Current is the order's invoice id, empty if it has none.
	Current, Got string
}

func (e *SecondInvoiceError) Error() string {
	return fmt.Sprintf("work order %s already %s with invoice %s, not %s", e.ID, StatusInvoiced, e.Current, e.Got)
}
