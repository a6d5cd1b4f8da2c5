// Package invoice is billing's pure domain: an invoice computed from a
// completed work order, in integer minor units with overflow checks. No
// floating point ever touches money.
package invoice

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/google/uuid"
)

// Order is what billing knows of a completed work order (from the
// WorkOrderCompletionRecorded event).
type Order struct {
	WorkOrderID    uuid.UUID
	CustomerID     string
	Description    string
	CompletedItems int32
	Currency       string
	UnitPriceMinor int64
}

// Line is one invoice line.
type Line struct {
	Description    string
	Quantity       int32
	UnitPriceMinor int64
	AmountMinor    int64
}

// Invoice is an issued invoice. Number is assigned by the store when it
// inserts the invoice: "INV-<issue year>-<sequence, at least 6 digits>".
type Invoice struct {
	ID          uuid.UUID
	Number      string
	WorkOrderID uuid.UUID
	CustomerID  string
	Currency    string
	Lines       []Line
	TotalMinor  int64
	IssuedAt    time.Time
}

// MaxMinorUnits bounds a price, as the money proto does (10^11 minor units).
const MaxMinorUnits = 100_000_000_000

// ErrInvalid wraps every reason an order cannot be invoiced. It is a
// business rejection: retrying cannot fix it.
var ErrInvalid = errors.New("invoice: cannot invoice")

var currencyCode = regexp.MustCompile(`^[A-Z]{3}$`)

// Validate reports why o cannot be invoiced.
func (o Order) Validate() error {
	var errs []error
	if o.WorkOrderID == uuid.Nil {
		errs = append(errs, errors.New("work_order_id: missing"))
	}
	if l := len(o.CustomerID); l < 1 || l > 64 {
		errs = append(errs, errors.New("customer_id: want 1..64 characters"))
	}
	if o.CompletedItems <= 0 {
		errs = append(errs, fmt.Errorf("completed_items %d: want > 0", o.CompletedItems))
	}
	if !currencyCode.MatchString(o.Currency) {
		errs = append(errs, fmt.Errorf("unit_price.currency_code %q: want ISO 4217 (3 capitals)", o.Currency))
	}
	if o.UnitPriceMinor < 0 || o.UnitPriceMinor > MaxMinorUnits {
		errs = append(errs, fmt.Errorf("unit_price.minor_units %d: want 0..%d", o.UnitPriceMinor, int64(MaxMinorUnits)))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
	}
	return nil
}

// Compute returns the invoice of o, issued at issuedAt with id id: one line,
// completed items × unit price.
func Compute(id uuid.UUID, o Order, issuedAt time.Time) (Invoice, error) {
	if err := o.Validate(); err != nil {
		return Invoice{}, err
	}
	amount, err := Mul(int64(o.CompletedItems), o.UnitPriceMinor)
	if err != nil {
		return Invoice{}, err
	}
	lines := []Line{{
		Description:    o.Description,
		Quantity:       o.CompletedItems,
		UnitPriceMinor: o.UnitPriceMinor,
		AmountMinor:    amount,
	}}
	var total int64
	for _, l := range lines {
		if total, err = Add(total, l.AmountMinor); err != nil {
			return Invoice{}, err
		}
	}
	return Invoice{
		ID:          id,
		WorkOrderID: o.WorkOrderID,
		CustomerID:  o.CustomerID,
		Currency:    o.Currency,
		Lines:       lines,
		TotalMinor:  total,
		IssuedAt:    issuedAt.UTC().Truncate(time.Microsecond), // PostgreSQL's precision
	}, nil
}

// Mul multiplies two non-negative amounts, failing on overflow.
func Mul(a, b int64) (int64, error) {
	if a < 0 || b < 0 {
		return 0, fmt.Errorf("%w: negative factor %d × %d", ErrInvalid, a, b)
	}
	if a != 0 && b > math.MaxInt64/a {
		return 0, fmt.Errorf("%w: %d × %d overflows int64 minor units", ErrInvalid, a, b)
	}
	return a * b, nil
}

// Add adds two non-negative amounts, failing on overflow.
func Add(a, b int64) (int64, error) {
	if a < 0 || b < 0 {
		return 0, fmt.Errorf("%w: negative term %d + %d", ErrInvalid, a, b)
	}
	if a > math.MaxInt64-b {
		return 0, fmt.Errorf("%w: %d + %d overflows int64 minor units", ErrInvalid, a, b)
	}
	return a + b, nil
}
