package overview_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/services/console/internal/overview"
)

// exposition serves what a workorder and a billing process export, with the
// created counter at *created.
func exposition(created *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `# TYPE lossless_workorder_orders_created_total counter
lossless_workorder_orders_created_total{otel_scope_name="x"} %d
# TYPE lossless_workorder_invoicing_messages_total counter
lossless_workorder_invoicing_messages_total{outcome="invoiced"} 7
lossless_workorder_invoicing_messages_total{outcome="duplicate"} 100
# TYPE lossless_workorder_orders gauge
lossless_workorder_orders{status="HANDED_OFF"} 4
# TYPE lossless_outbox_events_oldest_pending_age_seconds gauge
lossless_outbox_events_oldest_pending_age_seconds 12.5
# TYPE lossless_inbox_parked_entries gauge
lossless_inbox_parked_entries{reason="POISON"} 2
lossless_inbox_parked_entries{reason="UNKNOWN_ORDER"} 1
# TYPE lossless_pubsub_dead_letter_depth gauge
lossless_pubsub_dead_letter_depth{subscription="a"} 3
# TYPE lossless_leasequeue_jobs gauge
lossless_leasequeue_jobs{queue="invoices",state="dead"} 5
lossless_leasequeue_jobs{queue="invoices",state="available"} 50
`, created.Load())
	}
}

func TestRead_FiguresRatesAndUnreachableServices(t *testing.T) {
	var created atomic.Int64
	srv := httptest.NewServer(exposition(&created))
	defer srv.Close()
	now := time.Unix(1_000_000, 0)
	r, err := overview.NewReader([]overview.Target{
		{Service: "workorder", URL: srv.URL + "/metrics"},
		{Service: "billing", URL: "http://127.0.0.1:1/metrics"},
	}, &http.Client{Timeout: time.Second}, overview.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	created.Store(100)
	f, err := r.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if f.OrdersCreated != 100 || f.OrdersInvoiced != 7 || f.OpenOrders["HANDED_OFF"] != 4 || f.OldestPendingOutboxSeconds != 12.5 ||
		f.ParkedInbox["POISON"] != 2 || f.DeadLetterDepth != 3 || f.DeadJobs != 5 || f.CreatedPerSecond != 0 {
		t.Fatalf("figures %+v", f)
	}
	if f.Unreachable["billing"] == "" || f.Unreachable["workorder"] != "" {
		t.Fatalf("unreachable %v, want billing only", f.Unreachable)
	}

	// Within 900 ms: the same reading, no scrape.
	created.Store(150)
	now = now.Add(500 * time.Millisecond)
	if f, _ := r.Read(context.Background()); f.OrdersCreated != 100 {
		t.Fatalf("a reading 500 ms later scraped again: created %v", f.OrdersCreated)
	}
	// Two seconds after the first: 50 more orders → 25/s.
	now = now.Add(1500 * time.Millisecond)
	if f, _ := r.Read(context.Background()); f.CreatedPerSecond != 25 || f.InvoicedPerSecond != 0 {
		t.Fatalf("rates %v/%v, want 25 created/s and 0 invoiced/s", f.CreatedPerSecond, f.InvoicedPerSecond)
	}
	// The counter went down (workorder restarted): no rate rather than a negative one.
	created.Store(3)
	now = now.Add(time.Second)
	if f, _ := r.Read(context.Background()); f.CreatedPerSecond != 0 {
		t.Fatalf("rate %v across a counter reset, want 0", f.CreatedPerSecond)
	}
}
