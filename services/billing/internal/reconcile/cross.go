package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// Kinds found by CrossService.
const (
	// The order is COMPLETED (for longer than the grace) and billing has no
	// invoice for it: the completion event never reached billing, or its job
	// is stuck (see the local kinds).
	KindCompletedNotInvoiced = "completed_not_invoiced"
	// Billing invoiced the order but the order is still COMPLETED: the
	// InvoiceIssued event did not reach (or was parked by) the work-order service.
	KindInvoiceNotApplied = "invoice_not_applied"
	// The order is INVOICED with an invoice id billing does not have for it.
	KindInvoiceMismatch = "invoice_mismatch"
)

// WorkOrders is the part of the work-order API the check needs.
type WorkOrders interface {
	ListWorkOrders(ctx context.Context, req *workorderv1.ListWorkOrdersRequest, opts ...grpc.CallOption) (*workorderv1.ListWorkOrdersResponse, error)
}

const qInvoiceOfOrder = `SELECT id FROM invoices WHERE work_order_id = $1`

// PageTimeout bounds one ListWorkOrders call: the work-order service answers
// within its REQUEST_TIMEOUT (10s by default) or not at all, so a call on a
// connection that went dead fails then rather than at the command's end.
const PageTimeout = 10 * time.Second

// CrossService compares the work-order service's COMPLETED and INVOICED
// orders (through its API) with billing's invoices. Orders updated within
// grace are in flight and skipped.
func CrossService(ctx context.Context, db pgdb.Executor, wo WorkOrders, now time.Time, grace time.Duration) ([]Discrepancy, error) {
	var out []Discrepancy
	invoiceOf := func(orderID string) (string, error) {
		id, err := uuid.Parse(orderID)
		if err != nil {
			return "", fmt.Errorf("reconcile: work order id %q: %w", orderID, err)
		}
		var inv uuid.UUID
		err = db.QueryRow(ctx, qInvoiceOfOrder, id).Scan(&inv)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("reconcile: invoice of %s: %w", orderID, err)
		}
		return inv.String(), nil
	}
	for _, status := range []workorderv1.WorkOrderStatus{workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_COMPLETED, workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_INVOICED} {
		token := ""
		for {
			pctx, cancel := context.WithTimeout(ctx, PageTimeout)
			resp, err := wo.ListWorkOrders(pctx, &workorderv1.ListWorkOrdersRequest{Status: status, PageSize: 500, PageToken: token})
			cancel()
			if err != nil {
				return nil, fmt.Errorf("reconcile: list %s work orders: %w", status, err)
			}
			for _, o := range resp.GetWorkOrders() {
				if o.GetUpdateTime() != nil && now.Sub(o.GetUpdateTime().AsTime()) < grace {
					continue
				}
				inv, err := invoiceOf(o.GetId())
				if err != nil {
					return nil, err
				}
				switch {
				case status == workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_COMPLETED && inv == "":
					out = append(out, Discrepancy{Kind: KindCompletedNotInvoiced, WorkOrderID: o.GetId(),
						Detail: "order completed " + o.GetUpdateTime().AsTime().Format(time.RFC3339) + ", no invoice in billing"})
				case status == workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_COMPLETED:
					out = append(out, Discrepancy{Kind: KindInvoiceNotApplied, WorkOrderID: o.GetId(), InvoiceID: inv,
						Detail: "billing issued the invoice; the order is still COMPLETED"})
				case inv != o.GetInvoiceId():
					out = append(out, Discrepancy{Kind: KindInvoiceMismatch, WorkOrderID: o.GetId(), InvoiceID: o.GetInvoiceId(),
						Detail: fmt.Sprintf("order says invoice %q, billing has %q", o.GetInvoiceId(), inv)})
				}
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
	}
	return out, nil
}
