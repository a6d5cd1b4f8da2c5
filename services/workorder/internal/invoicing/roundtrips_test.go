package invoicing_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
)

// An InvoiceIssued costs four round trips at a database's distance (ADR
// 0023): BEGIN with the savepoint and the marker's claim, the order's
// locking read, its save, COMMIT. Seven before.
func TestRoundTripsOfOneInvoiceIssued(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, migrations.WorkOrder()...)
	inv, err := invoicing.New(pool, invoicing.Config{}, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{pool: pool, inv: inv}
	ctx := context.Background()
	if err := inv.Handle(ctx, message(t, issued(b.order(t, "COMPLETED")))); err != nil { // the statement cache
		t.Fatal(err)
	}
	id := b.order(t, "COMPLETED")
	ev := issued(id)
	rt.Reset()
	outs, errs := inv.Process(ctx, []*pubsub.Received{message(t, ev)})
	if n := rt.Load(); n != 4 {
		t.Errorf("round trips %d, want 4", n)
	}
	if errs[0] != nil || outs[0] != invoicing.OutcomeInvoiced {
		t.Fatalf("%v %v", outs, errs)
	}
	b.wantInvoicedOnce(t, id, ev)
}
