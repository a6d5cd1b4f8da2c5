package invoice_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/services/billing/internal/invoice"
)

func order() invoice.Order {
	return invoice.Order{
		WorkOrderID: uuid.MustParse("0190b6f0-0000-7000-8000-000000000001"), CustomerID: "cust-1",
		Description: "paint", CompletedItems: 3, Currency: "EUR", UnitPriceMinor: 1999,
	}
}

func TestComputeMultipliesInMinorUnits(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 5, 1, 10, 0, 0, 123456789, time.FixedZone("x", 3600))
	inv, err := invoice.Compute(uuid.New(), order(), at)
	if err != nil {
		t.Fatal(err)
	}
	if inv.TotalMinor != 5997 || len(inv.Lines) != 1 || inv.Lines[0].AmountMinor != 5997 || inv.Lines[0].Quantity != 3 {
		t.Fatalf("%+v", inv)
	}
	if inv.IssuedAt.Location() != time.UTC || inv.IssuedAt.Nanosecond()%1000 != 0 {
		t.Fatalf("issued at %v: want UTC, microseconds", inv.IssuedAt)
	}
}

func TestComputeRejects(t *testing.T) {
	t.Parallel()
	cases := map[string]func(*invoice.Order){
		"no order":     func(o *invoice.Order) { o.WorkOrderID = uuid.Nil },
		"no customer":  func(o *invoice.Order) { o.CustomerID = "" },
		"zero items":   func(o *invoice.Order) { o.CompletedItems = 0 },
		"bad currency": func(o *invoice.Order) { o.Currency = "eur" },
		"negative":     func(o *invoice.Order) { o.UnitPriceMinor = -1 },
		"too large":    func(o *invoice.Order) { o.UnitPriceMinor = invoice.MaxMinorUnits + 1 },
	}
	for name, mutate := range cases {
		o := order()
		mutate(&o)
		if _, err := invoice.Compute(uuid.New(), o, time.Now()); !errors.Is(err, invoice.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestOverflowChecked(t *testing.T) {
	t.Parallel()
	if _, err := invoice.Mul(math.MaxInt64/2+1, 2); !errors.Is(err, invoice.ErrInvalid) {
		t.Fatalf("Mul overflow: %v", err)
	}
	if v, err := invoice.Mul(math.MaxInt64/2, 2); err != nil || v != math.MaxInt64-1 {
		t.Fatalf("Mul edge: %v %v", v, err)
	}
	if _, err := invoice.Add(math.MaxInt64, 1); !errors.Is(err, invoice.ErrInvalid) {
		t.Fatalf("Add overflow: %v", err)
	}
	if v, err := invoice.Mul(0, math.MaxInt64); err != nil || v != 0 {
		t.Fatalf("Mul zero: %v %v", v, err)
	}
}
