package web

import (
	"context"

	"google.golang.org/grpc"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
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

// Inbox is the workorder service's OperatorService as the Repair page and
// the Order page's timeline use its inbox entries (operator token on every
// call, reads included).
type Inbox interface {
	ListInboxEntries(ctx context.Context, in *opsv1.ListInboxEntriesRequest, opts ...grpc.CallOption) (*opsv1.ListInboxEntriesResponse, error)
	ReplayInboxEntries(ctx context.Context, in *opsv1.ReplayInboxEntriesRequest, opts ...grpc.CallOption) (*opsv1.ReplayInboxEntriesResponse, error)
}

// BillingRepairs is billing's OperatorService as the Repair page uses it
// for the invoice jobs (operator token on every call).
type BillingRepairs interface {
	ListJobs(ctx context.Context, in *opsv1.ListJobsRequest, opts ...grpc.CallOption) (*opsv1.ListJobsResponse, error)
	RetryJobs(ctx context.Context, in *opsv1.RetryJobsRequest, opts ...grpc.CallOption) (*opsv1.RetryJobsResponse, error)
}

// Operator is one service's OperatorService (pkg/operator), as the Repair
// and Audit pages use it: outbox, parked messages, dead letters (the
// workorder service's: of the consumers invoicing and inbox) and the
// operator_audit log (operator token on every call).
type Operator interface {
	ListOutboxEvents(ctx context.Context, in *opsv1.ListOutboxEventsRequest, opts ...grpc.CallOption) (*opsv1.ListOutboxEventsResponse, error)
	RequeueOutboxEvents(ctx context.Context, in *opsv1.RequeueOutboxEventsRequest, opts ...grpc.CallOption) (*opsv1.RequeueOutboxEventsResponse, error)
	ListParkedMessages(ctx context.Context, in *opsv1.ListParkedMessagesRequest, opts ...grpc.CallOption) (*opsv1.ListParkedMessagesResponse, error)
	ReplayParkedMessage(ctx context.Context, in *opsv1.ReplayParkedMessageRequest, opts ...grpc.CallOption) (*opsv1.ReplayParkedMessageResponse, error)
	ReplayDeadLetters(ctx context.Context, in *opsv1.ReplayDeadLettersRequest, opts ...grpc.CallOption) (*opsv1.ReplayDeadLettersResponse, error)
	ListOperatorAudit(ctx context.Context, in *opsv1.ListOperatorAuditRequest, opts ...grpc.CallOption) (*opsv1.ListOperatorAuditResponse, error)
}

// AuditLog is a service's OperatorService as the Audit page reads it:
// provider-sim mounts only this method (its fault changes' rows).
type AuditLog interface {
	ListOperatorAudit(ctx context.Context, in *opsv1.ListOperatorAuditRequest, opts ...grpc.CallOption) (*opsv1.ListOperatorAuditResponse, error)
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

// Outbox is the workorder service's OperatorService outbox read, as the
// Order page's timeline uses it (operator token).
type Outbox interface {
	ListOutboxEvents(ctx context.Context, in *opsv1.ListOutboxEventsRequest, opts ...grpc.CallOption) (*opsv1.ListOutboxEventsResponse, error)
}

// ProviderJobs is provider-sim's ProviderAdminService job reads (operator
// token).
type ProviderJobs interface {
	ListJobs(ctx context.Context, in *providerv1.ListJobsRequest, opts ...grpc.CallOption) (*providerv1.ListJobsResponse, error)
	GetJob(ctx context.Context, in *providerv1.GetJobRequest, opts ...grpc.CallOption) (*providerv1.GetJobResponse, error)
}

// InvoiceJobs is billing's OperatorService job read, as the Order page's
// timeline uses it (operator token).
type InvoiceJobs interface {
	ListJobs(ctx context.Context, in *opsv1.ListJobsRequest, opts ...grpc.CallOption) (*opsv1.ListJobsResponse, error)
}

// Figures are the services' metrics (package overview).
type Figures interface {
	Read(ctx context.Context) (overview.Figures, error)
}

// Sources are every source the pages read and act through. All required.
type Sources struct {
	Orders Orders
	Inbox  Inbox
	// BillingRepairs and the two services' OperatorService (WorkOrderOps,
	// BillingOps): the Repair and Audit pages.
	BillingRepairs BillingRepairs
	WorkOrderOps   Operator
	BillingOps     Operator
	// ProviderAudit is provider-sim's OperatorService: the Audit page's
	// fault changes (UpdateFaults records them).
	ProviderAudit AuditLog
	Faults        Faults
	Invoices      Invoices
	Figures       Figures
	// Outbox, ProviderJobs and InvoiceJobs: the Order page's timeline.
	Outbox       Outbox
	ProviderJobs ProviderJobs
	InvoiceJobs  InvoiceJobs
}
