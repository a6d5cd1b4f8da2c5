package web

import (
	"context"

	"google.golang.org/grpc"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/services/console/internal/overview"
)

// The console's data sources: each the few RPCs of one service API a page
// uses, so the generated gRPC client satisfies it as it is. A page that
// gains a source (the outbox events, audit log, billing and provider jobs
// of the Order page) gets one more small interface here and one more field
// in Sources; the pages already written do not change.

// Orders is the workorder service's WorkOrderService.
type Orders interface {
	CreateWorkOrder(ctx context.Context, in *workorderv1.CreateWorkOrderRequest, opts ...grpc.CallOption) (*workorderv1.CreateWorkOrderResponse, error)
	GetWorkOrder(ctx context.Context, in *workorderv1.GetWorkOrderRequest, opts ...grpc.CallOption) (*workorderv1.GetWorkOrderResponse, error)
	ListWorkOrders(ctx context.Context, in *workorderv1.ListWorkOrdersRequest, opts ...grpc.CallOption) (*workorderv1.ListWorkOrdersResponse, error)
	ListWorkOrderHistory(ctx context.Context, in *workorderv1.ListWorkOrderHistoryRequest, opts ...grpc.CallOption) (*workorderv1.ListWorkOrderHistoryResponse, error)
}

// Inbox is the workorder service's WorkOrderAdminService (operator token
// on every call, reads included).
type Inbox interface {
	ListInboxEntries(ctx context.Context, in *workorderv1.ListInboxEntriesRequest, opts ...grpc.CallOption) (*workorderv1.ListInboxEntriesResponse, error)
	ReplayInboxEntries(ctx context.Context, in *workorderv1.ReplayInboxEntriesRequest, opts ...grpc.CallOption) (*workorderv1.ReplayInboxEntriesResponse, error)
}

// Faults is provider-sim's ProviderAdminService (UpdateFaults needs the
// operator token, GetFaults is open).
type Faults interface {
	GetFaults(ctx context.Context, in *providerv1.GetFaultsRequest, opts ...grpc.CallOption) (*providerv1.GetFaultsResponse, error)
	UpdateFaults(ctx context.Context, in *providerv1.UpdateFaultsRequest, opts ...grpc.CallOption) (*providerv1.UpdateFaultsResponse, error)
}

// Invoices is billing's BillingService.
type Invoices interface {
	GetInvoice(ctx context.Context, in *billingv1.GetInvoiceRequest, opts ...grpc.CallOption) (*billingv1.GetInvoiceResponse, error)
}

// Figures are the services' metrics (package overview).
type Figures interface {
	Read(ctx context.Context) (overview.Figures, error)
}

// Sources are every source the pages read and act through. All required.
type Sources struct {
	Orders   Orders
	Inbox    Inbox
	Faults   Faults
	Invoices Invoices
	Figures  Figures
}
