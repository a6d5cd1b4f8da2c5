package reconcile_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/services/billing/internal/reconcile"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The runbook quotes the reconciliation query; it must be the one the
// command runs.
func TestRunbookQuotesTheQuery(t *testing.T) {
	t.Parallel()
	rb, err := os.ReadFile("../../../../docs/runbooks/billing-jobs-dead-or-stuck.md")
	if err != nil {
		t.Fatal(err)
	}
	q := strings.NewReplacer("$1", "'invoices'", "$2::timestamptz", "now()", "$3::interval", "interval '5 minutes'").
		Replace(strings.TrimSpace(reconcile.LocalSQL))
	if !strings.Contains(string(rb), q) {
		t.Fatal("docs/runbooks/billing-jobs-dead-or-stuck.md does not quote reconcile.LocalSQL")
	}
}

// orders is the work-order API's list, served from memory.
type orders []*workorderv1.WorkOrder

func (o orders) ListWorkOrders(_ context.Context, req *workorderv1.ListWorkOrdersRequest, _ ...grpc.CallOption) (*workorderv1.ListWorkOrdersResponse, error) {
	var out []*workorderv1.WorkOrder
	for _, w := range o {
		if w.GetStatus() == req.GetStatus() {
			out = append(out, w)
		}
	}
	return &workorderv1.ListWorkOrdersResponse{WorkOrders: out}, nil
}

func TestCrossServiceFindsEachKind(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, migrations.Billing()...)
	ctx := context.Background()
	now := time.Now()
	old := timestamppb.New(now.Add(-time.Hour))
	invoiced, notApplied, missing, mismatch, fresh := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	invoiceOf := map[uuid.UUID]uuid.UUID{}
	for i, wo := range []uuid.UUID{invoiced, notApplied, mismatch} {
		inv := uuid.New()
		invoiceOf[wo] = inv
		if _, err := pool.Exec(ctx, `WITH j AS (INSERT INTO leasequeue_jobs (queue, unique_key, payload, state, max_attempts, due_at, epoch)
			VALUES ('invoices', $1::text, '', 'done', 10, now(), 1) RETURNING id)
			INSERT INTO invoices (id, number, work_order_id, customer_id, currency_code, total_minor, issued_at, job_id, source_event)
			SELECT $2, 'INV-2026-00000' || $3::int, $1::uuid, 'c', 'EUR', 1, now(), j.id, 'e' FROM j`, wo, inv, i); err != nil {
			t.Fatal(err)
		}
	}
	wo := orders{
		{Id: invoiced.String(), Status: workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_INVOICED, InvoiceId: invoiceOf[invoiced].String(), UpdateTime: old},
		{Id: notApplied.String(), Status: workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_COMPLETED, UpdateTime: old},
		{Id: missing.String(), Status: workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_COMPLETED, UpdateTime: old},
		{Id: mismatch.String(), Status: workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_INVOICED, InvoiceId: uuid.NewString(), UpdateTime: old},
		{Id: fresh.String(), Status: workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_COMPLETED, UpdateTime: timestamppb.New(now)},
	}
	found, err := reconcile.CrossService(ctx, pool, wo, now, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, d := range found {
		got[d.WorkOrderID] = d.Kind
	}
	want := map[string]string{
		notApplied.String(): reconcile.KindInvoiceNotApplied,
		missing.String():    reconcile.KindCompletedNotInvoiced,
		mismatch.String():   reconcile.KindInvoiceMismatch,
	}
	if len(got) != len(want) {
		t.Fatalf("found %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("order %s: %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if local, err := reconcile.Local(ctx, pool, "invoices", now, time.Minute); err != nil || len(local) != 0 {
		t.Fatalf("local on consistent jobs/invoices: %v %v", local, err)
	}
}

// Only a FAILED InvoiceIssued is a discrepancy: a pending event is on its
// way, and a published one has left the outbox for outbox_published.
func TestLocalFindsOnlyFailedInvoiceEvents(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, migrations.Billing()...)
	ctx := context.Background()
	failed, pending, published := uuid.New(), uuid.New(), uuid.New()
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload, occurred_at, status, attempts, last_error)
VALUES ($1::uuid, 'invoice', $1::uuid::text, 'lossless.events.v1.InvoiceIssued', '', now(), 'FAILED', 1, 'no dispatcher'),
       ($2::uuid, 'invoice', $2::uuid::text, 'lossless.events.v1.InvoiceIssued', '', now(), 'PENDING', 0, NULL)`, failed, pending); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox_published (event_id, id, aggregate_type, aggregate_id, event_type, schema_version, payload, headers,
                              attempts, occurred_at, created_at, published_at)
VALUES ($1::uuid, 1000, 'invoice', $1::uuid::text, 'lossless.events.v1.InvoiceIssued', 1, '', '{}', 1, now(), now(), now())`, published); err != nil {
		t.Fatal(err)
	}
	found, err := reconcile.Local(ctx, pool, "invoices", time.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 || found[0].Kind != reconcile.KindInvoiceEventFailed || found[0].WorkOrderID != failed.String() ||
		!strings.Contains(found[0].Detail, "no dispatcher") {
		t.Fatalf("found %+v, want one %s for %s", found, reconcile.KindInvoiceEventFailed, failed)
	}
}

// A parked message is a discrepancy until an operator replays it.
func TestLocalReportsParkedMessagesUntilReplayed(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, migrations.Billing()...)
	ctx := context.Background()
	store, err := parked.New()
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, msg := range []string{"m-open", "m-replayed"} {
		st, err := store.Park(ctx, pool, parked.Message{Subscription: "billing.workorder-events", MessageID: msg, Reason: "POISON: " + msg})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, st.ID)
	}
	if err := store.Replay(ctx, pool, ids[1], "INC-1", "jane", func(context.Context, pgx.Tx, parked.Parked) error { return nil }); err != nil {
		t.Fatal(err)
	}
	found, err := reconcile.Local(ctx, pool, "invoices", time.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 || found[0].Kind != reconcile.KindMessageParked || !strings.Contains(found[0].Detail, "m-open") {
		t.Fatalf("found %+v, want one %s for m-open", found, reconcile.KindMessageParked)
	}
}
