package orders

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
)

// Every (from, to) pair, including "before creation": legal exactly for the
// rows of the table, ErrIllegalTransition naming the pair otherwise.
func TestCheckTransitionEveryPair(t *testing.T) {
	t.Parallel()
	legal := map[[2]Status]bool{
		{"", StatusCreated}:                true,
		{StatusCreated, StatusHandedOff}:   true,
		{StatusCreated, StatusCancelled}:   true,
		{StatusHandedOff, StatusHandedOff}: true,
		{StatusHandedOff, StatusCompleted}: true,
		{StatusCompleted, StatusCompleted}: true,
		{StatusCompleted, StatusInvoiced}:  true,
		{StatusInvoiced, StatusInvoiced}:   true,
		{StatusCancelled, StatusCancelled}: true,
	}
	for _, from := range append([]Status{""}, Statuses()...) {
		for _, to := range append([]Status{""}, Statuses()...) {
			err := CheckTransition(from, to)
			if legal[[2]Status{from, to}] {
				if err != nil {
					t.Errorf("%q -> %q: %v, want legal", from, to, err)
				}
				continue
			}
			var illegal *IllegalTransitionError
			if !errors.Is(err, ErrIllegalTransition) || !errors.As(err, &illegal) || illegal.From != from || illegal.To != to {
				t.Errorf("%q -> %q: %v, want ErrIllegalTransition naming the pair", from, to, err)
			}
		}
	}
}

// operation applies one lifecycle operation to o.
type operation struct {
	name string
	do   func(o *Order) error
}

const invoiceA = "0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11"

func operations() []operation {
	return []operation{
		{"cancel", func(o *Order) error { return o.Cancel("r") }},
		{"accept hand-off", func(o *Order) error { o.AcceptHandOff("job-9", "ev-9"); return nil }},
		{"start", func(o *Order) error { return o.RecordExecutionStarted("inbox:s") }},
		{"tranche", func(o *Order) error { _, err := o.Complete(1, "inbox:t"); return err }},
		{"complete", func(o *Order) error { _, err := o.Complete(2, "inbox:c"); return err }},
		{"re-hand-off", func(o *Order) error { return o.ReHandOff("operator:re-hand-off:T-1") }},
		{"invoice", func(o *Order) error { _, err := o.Invoice(uuid.MustParse(invoiceA), "billing:INV-1"); return err }},
	}
}

// fixture is an order in status s as loaded under the lock: HANDED_OFF with
// its one open waiting point, INVOICED with invoice A, CANCELLED before any
// hand-off; 2 positions, none completed before COMPLETED.
func fixture(s Status) Order {
	o := Order{ID: uuid.New(), Positions: 2, Status: s}
	switch s {
	case StatusHandedOff:
		o.ProviderJobID, o.open = "job-1", []int64{7}
	case StatusCompleted:
		o.ProviderJobID, o.CompletedItems = "job-1", 2
	case StatusInvoiced:
		o.ProviderJobID, o.CompletedItems, o.InvoiceID = "job-1", 2, invoiceA
	}
	return o
}

// Every operation from every status: the status it leads to (same status:
// a history entry only), a repeat that changes nothing, or
// ErrIllegalTransition with the order unchanged.
func TestOperationsFromEveryStatus(t *testing.T) {
	t.Parallel()
	const (
		illegal = "illegal"
		repeat  = "repeat"
	)
	want := map[string]map[Status]string{
		"cancel": {StatusCreated: "CANCELLED", StatusHandedOff: illegal, StatusCompleted: illegal,
			StatusInvoiced: illegal, StatusCancelled: repeat},
		"accept hand-off": {StatusCreated: "HANDED_OFF", StatusHandedOff: repeat, StatusCompleted: repeat,
			StatusInvoiced: repeat, StatusCancelled: "CANCELLED"},
		"start": {StatusCreated: illegal, StatusHandedOff: "HANDED_OFF", StatusCompleted: "COMPLETED",
			StatusInvoiced: "INVOICED", StatusCancelled: illegal},
		"tranche": {StatusCreated: illegal, StatusHandedOff: "HANDED_OFF", StatusCompleted: illegal,
			StatusInvoiced: illegal, StatusCancelled: illegal},
		"complete": {StatusCreated: illegal, StatusHandedOff: "COMPLETED", StatusCompleted: illegal,
			StatusInvoiced: illegal, StatusCancelled: illegal},
		"re-hand-off": {StatusCreated: illegal, StatusHandedOff: "HANDED_OFF", StatusCompleted: illegal,
			StatusInvoiced: illegal, StatusCancelled: illegal},
		"invoice": {StatusCreated: illegal, StatusHandedOff: illegal, StatusCompleted: "INVOICED",
			StatusInvoiced: repeat, StatusCancelled: illegal},
	}
	for _, op := range operations() {
		for _, from := range Statuses() {
			t.Run(fmt.Sprintf("%s from %s", op.name, from), func(t *testing.T) {
				t.Parallel()
				o := fixture(from)
				before := fmt.Sprintf("%+v", o)
				err := op.do(&o)
				switch w := want[op.name][from]; w {
				case illegal:
					var e *IllegalTransitionError
					if !errors.Is(err, ErrIllegalTransition) || !errors.As(err, &e) || e.From != from || e.ID != o.ID {
						t.Fatalf("err = %v, want ErrIllegalTransition from %s", err, from)
					}
					if after := fmt.Sprintf("%+v", o); after != before {
						t.Fatalf("refused operation changed the order:\n%s\n%s", before, after)
					}
				case repeat:
					if err != nil || o.changed() || o.Status != from {
						t.Fatalf("repeat: err %v, changed %v, status %s", err, o.changed(), o.Status)
					}
				default:
					if err != nil || o.Status != Status(w) || len(o.transitions) != 1 {
						t.Fatalf("err %v, status %s, transitions %+v; want %s with one transition", err, o.Status, o.transitions, w)
					}
					// Whatever an operation records is a row of the table.
					if tr := o.transitions[0]; tr.From != from || CheckTransition(tr.From, tr.To) != nil {
						t.Fatalf("recorded %+v, not a legal transition from %s", tr, from)
					}
				}
			})
		}
	}
}

// The lifecycle's checks of a report on a HANDED_OFF order, in their
// contract order: status, then waiting points, then positions.
func TestCompletePrecedence(t *testing.T) {
	t.Parallel()
	o := fixture(StatusCompleted)
	if _, err := o.Complete(5, "c"); !errors.Is(err, ErrIllegalTransition) {
		t.Errorf("COMPLETED without waiting point, excess: %v, want ErrIllegalTransition", err)
	}
	for _, open := range [][]int64{nil, {1, 2}} {
		o := fixture(StatusHandedOff)
		o.open = open
		var wpErr *WaitingPointError
		if _, err := o.Complete(5, "c"); !errors.As(err, &wpErr) || len(wpErr.Open) != len(open) {
			t.Errorf("open waiting points %v, excess: %v, want *WaitingPointError", open, err)
		}
		if err := o.RecordExecutionStarted("s"); !errors.As(err, &wpErr) {
			t.Errorf("start with open waiting points %v: %v, want *WaitingPointError", open, err)
		}
	}
	o = fixture(StatusHandedOff)
	var excess *ExcessItemsError
	if _, err := o.Complete(3, "c"); !errors.As(err, &excess) || o.CompletedItems != 0 || o.changed() {
		t.Errorf("excess tranche: %v, order %+v", err, o)
	}
	// A tranche short of the positions keeps the waiting point; the last
	// consumes it.
	o = fixture(StatusHandedOff)
	if done, err := o.Complete(1, "inbox:a"); done || err != nil || o.transitions[0].Cause != "inbox:a:tranche 1/2" || len(o.consumed) != 0 {
		t.Fatalf("first tranche: %v %v %+v", done, err, o)
	}
	if done, err := o.Complete(1, "inbox:b"); !done || err != nil || o.Status != StatusCompleted || len(o.consumed) != 1 || o.consumed[0].waitingPoint != 7 {
		t.Fatalf("last tranche: %v %v %+v", done, err, o)
	}
}

func TestSecondInvoiceIsRefused(t *testing.T) {
	t.Parallel()
	o := fixture(StatusInvoiced)
	var second *SecondInvoiceError
	if _, err := o.Invoice(uuid.New(), "billing:INV-2"); !errors.As(err, &second) || second.Current != invoiceA || o.changed() {
		t.Fatalf("second invoice: %v, order %+v", err, o)
	}
}
