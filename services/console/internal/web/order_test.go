package web_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/services/console/internal/web"
)

const (
	orderID   = "8a3c4c8e-1f0b-4a8e-9d7e-2b8b7f0a1c11"
	invoiceID = "5d1e8f0a-0b6e-4a52-8f0e-3c4a9b2d7e10"
	jobID     = "01970000-0000-7000-8000-000000000001"
)

// at is the n-th second of the order's life.
func at(n int) *timestamppb.Timestamp {
	return timestamppb.New(time.Date(2026, 4, 1, 8, 0, n, 0, time.UTC))
}

// orderBackend answers for one invoiced order as the three services would,
// the operator reads behind the same operator guard as theirs; billing's
// job read is down.
type orderBackend struct {
	workorderv1.UnimplementedWorkOrderServiceServer
	providerv1.UnimplementedProviderAdminServiceServer
	billingv1.UnimplementedBillingServiceServer
}

// orderOps is the workorder service's OperatorService outbox and inbox
// reads.
type orderOps struct {
	opsv1.UnimplementedOperatorServiceServer
}

// billingJobsDown is billing's OperatorService job read with its database
// unreachable.
type billingJobsDown struct{}

func (orderBackend) GetWorkOrder(context.Context, *workorderv1.GetWorkOrderRequest) (*workorderv1.GetWorkOrderResponse, error) {
	return &workorderv1.GetWorkOrderResponse{WorkOrder: &workorderv1.WorkOrder{Id: orderID, CustomerId: "c-1", Positions: 2,
		CompletedItems: 2, Status: workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_INVOICED, InvoiceId: invoiceID,
		CreateTime: at(0), UpdateTime: at(9), UnitPrice: &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 990}}}, nil
}

func (orderBackend) ListWorkOrderHistory(context.Context, *workorderv1.ListWorkOrderHistoryRequest) (*workorderv1.ListWorkOrderHistoryResponse, error) {
	tr := func(from, to workorderv1.WorkOrderStatus, n int) *workorderv1.StatusTransition {
		return &workorderv1.StatusTransition{FromStatus: from, ToStatus: to, Cause: "test", Time: at(n)}
	}
	return &workorderv1.ListWorkOrderHistoryResponse{Transitions: []*workorderv1.StatusTransition{
		tr(0, workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_CREATED, 0),
		tr(workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_CREATED, workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_HANDED_OFF, 2),
		tr(workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_HANDED_OFF, workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_COMPLETED, 5),
		tr(workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_COMPLETED, workorderv1.WorkOrderStatus_WORK_ORDER_STATUS_INVOICED, 9),
	}}, nil
}

func (orderOps) ListOutboxEvents(_ context.Context, req *opsv1.ListOutboxEventsRequest) (*opsv1.ListOutboxEventsResponse, error) {
	if req.GetAggregateId() != orderID || len(req.GetStates()) != 3 {
		return nil, status.Error(codes.InvalidArgument, "want the order's events in every state")
	}
	return &opsv1.ListOutboxEventsResponse{Events: []*opsv1.OutboxEvent{{EventId: "ev-handoff",
		AggregateId: orderID, EventType: "lossless.events.v1.WorkOrderHandOffRequested", State: "PUBLISHED", Attempts: 1,
		CreateTime: at(0), PublishTime: at(2)}}}, nil
}

func (orderBackend) ListJobs(_ context.Context, req *providerv1.ListJobsRequest) (*providerv1.ListJobsResponse, error) {
	if req.GetWorkOrderId() != orderID {
		return &providerv1.ListJobsResponse{}, nil
	}
	return &providerv1.ListJobsResponse{Jobs: []*providerv1.Job{{JobId: jobID, WorkOrderId: orderID, State: "DONE"}}}, nil
}

func (orderBackend) GetJob(context.Context, *providerv1.GetJobRequest) (*providerv1.GetJobResponse, error) {
	return &providerv1.GetJobResponse{
		Job: &providerv1.Job{JobId: jobID, WorkOrderId: orderID, State: "DONE", LeaseEpoch: 3, AcceptTime: at(1),
			StartTime: at(2), CompleteTime: at(3), Faults: &providerv1.JobFaults{Duplicate: true}},
		Messages: []*providerv1.JobMessage{
			{EventId: "ev-started", Sequence: 1, Kind: "STARTED", OrderingKey: orderID, Copies: 1, PublishCount: 1, OccurTime: at(2), PublishTime: at(2)},
			{EventId: "ev-done", Sequence: 2, Kind: "COMPLETED", OrderingKey: orderID, Copies: 2, PublishCount: 2, OccurTime: at(3), PublishTime: at(4)},
		}}, nil
}

func (orderOps) ListInboxEntries(_ context.Context, req *opsv1.ListInboxEntriesRequest) (*opsv1.ListInboxEntriesResponse, error) {
	if strings.Join(req.GetEventIds(), ",") != "ev-started,ev-done" {
		return nil, status.Error(codes.InvalidArgument, "want the provider's event ids")
	}
	return &opsv1.ListInboxEntriesResponse{Entries: []*opsv1.InboxEntry{
		{Id: 1, EventId: "ev-started", Status: "APPLIED", ReceivedTime: at(2), ProcessedTime: at(2)},
		{Id: 2, EventId: "ev-done", Status: "APPLIED", ReceivedTime: at(4), ProcessedTime: at(5)},
	}}, nil
}

func (billingJobsDown) ListJobs(context.Context, *opsv1.ListJobsRequest, ...grpc.CallOption) (*opsv1.ListJobsResponse, error) {
	return nil, status.Error(codes.Unavailable, "billing database unreachable")
}

func (orderBackend) GetInvoice(context.Context, *billingv1.GetInvoiceRequest) (*billingv1.GetInvoiceResponse, error) {
	return &billingv1.GetInvoiceResponse{Invoice: &billingv1.Invoice{Id: invoiceID, Number: "INV-2026-000042",
		WorkOrderId: orderID, IssueTime: at(8), Total: &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 1980}}}, nil
}

// orderConsole serves the console over orderBackend; traceURL is its
// web.Config.TraceURL.
func orderConsole(t *testing.T, traceURL string) *httptest.Server {
	t.Helper()
	guard, err := operator.NewGuard(token, "TEST_TOKEN", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
		guard.ServiceInterceptor(opsv1.OperatorService_ServiceDesc.ServiceName),
		guard.Interceptor(providerv1.ProviderAdminService_ListJobs_FullMethodName, providerv1.ProviderAdminService_GetJob_FullMethodName)))
	var b orderBackend
	workorderv1.RegisterWorkOrderServiceServer(srv, b)
	opsv1.RegisterOperatorServiceServer(srv, orderOps{})
	providerv1.RegisterProviderAdminServiceServer(srv, b)
	billingv1.RegisterBillingServiceServer(srv, b)
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		operator.ConsoleDialOptions(nil, token)...)...) // as package app dials without an identity
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h, err := web.New(web.Sources{
		Orders: workorderv1.NewWorkOrderServiceClient(conn), Inbox: opsv1.NewOperatorServiceClient(conn),
		Faults: providerv1.NewProviderAdminServiceClient(conn), Invoices: billingv1.NewBillingServiceClient(conn),
		Figures: noFigures{}, Outbox: opsv1.NewOperatorServiceClient(conn),
		ProviderJobs: providerv1.NewProviderAdminServiceClient(conn), InvoiceJobs: billingJobsDown{},
		BillingRepairs: opsv1.NewOperatorServiceClient(conn),
		WorkOrderOps:   opsv1.NewOperatorServiceClient(conn), BillingOps: opsv1.NewOperatorServiceClient(conn),
		ProviderAudit: opsv1.NewOperatorServiceClient(conn),
	}, web.Config{OperatorToken: token, ReadOpen: true, RunbookBaseURL: "https://example.invalid/", TraceURL: traceURL}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts
}

var kindRE = regexp.MustCompile(`<li data-kind="([a-z-]+)"`)

// source returns the source list's line of name.
func source(t *testing.T, page, name string) string {
	t.Helper()
	i := strings.Index(page, `data-source="`+name+`"`)
	if i < 0 {
		t.Fatalf("no source %q on the page", name)
	}
	return page[i : i+strings.Index(page[i:], "</li>")]
}

// The order's page merges what the three services recorded into one
// timeline in time order; the operator's sources say "log in to see" until
// the operator logs in, and a source that fails shows its error while the
// rest of the page renders.
func TestOrderPage_OneTimelineAcrossTheServices(t *testing.T) {
	ts := orderConsole(t, "")
	br := newBrowser(t, ts.URL)

	code, page, _ := br.do(http.MethodGet, "/orders/"+orderID, nil)
	if code != http.StatusOK {
		t.Fatalf("anonymous order page: %d", code)
	}
	// No trace store configured: where to look instead, no waterfall.
	if !strings.Contains(page, "Traces are not collected here") || !strings.Contains(page, "make trace ORDER="+orderID) ||
		strings.Contains(page, `class="waterfall"`) {
		t.Errorf("order page without CONSOLE_TRACE_URL lacks the pointer to make trace / Jaeger")
	}
	var kinds []string
	for _, m := range kindRE.FindAllStringSubmatch(page, -1) {
		kinds = append(kinds, m[1])
	}
	if got, want := strings.Join(kinds, ","), "status,status,status,invoice,status"; got != want {
		t.Errorf("anonymous timeline %s, want %s", got, want)
	}
	for _, name := range []string{"Outbox events", "Provider job and messages", "Inbox entries", "Invoice job"} {
		if s := source(t, page, name); !strings.Contains(s, "log in to see") {
			t.Errorf("anonymous source %q: %s, want log in to see", name, s)
		}
	}

	br.login(token)
	code, page, _ = br.do(http.MethodGet, "/orders/"+orderID, nil)
	if code != http.StatusOK {
		t.Fatalf("order page: %d", code)
	}
	kinds = kinds[:0]
	for _, m := range kindRE.FindAllStringSubmatch(page, -1) {
		kinds = append(kinds, m[1])
	}
	// Seconds: status 0, outbox 0, job 1, STARTED 2 (and its inbox entry,
	// HANDED_OFF), COMPLETED 3, its inbox entry 4, COMPLETED 5, invoice 8,
	// INVOICED 9; ties in the order of the sources.
	want := "status,outbox,provider-job,status,provider-message,inbox,provider-message,inbox,status,invoice,status"
	if got := strings.Join(kinds, ","); got != want {
		t.Errorf("timeline\n%s, want\n%s", got, want)
	}
	for _, s := range []string{
		`<time datetime="2026-04-01T08:00:00Z">`, "Outbox event WorkOrderHandOffRequested PUBLISHED", "Provider job DONE",
		"epoch 3", "faults: duplicate", "Provider message COMPLETED, duplicated", "published 2× (2 per publish)",
		"Inbox entry APPLIED", "Invoice INV-2026-000042 issued",
	} {
		if !strings.Contains(page, s) {
			t.Errorf("page lacks %q", s)
		}
	}
	if s := source(t, page, "Invoice job"); !strings.Contains(s, "billing database unreachable") || !strings.Contains(s, `role="alert"`) {
		t.Errorf("failing source: %s, want its error", s)
	}
	if s := source(t, page, "Inbox entries"); !strings.Contains(s, "2 shown") {
		t.Errorf("inbox source: %s", s)
	}

	// The live JSON carries the same timeline.
	code, body, _ := br.do(http.MethodGet, "/api/orders/"+orderID, nil)
	if code != http.StatusOK || strings.Count(body, `"kind":`) != len(kinds) {
		t.Errorf("order JSON %d: %.300s", code, body)
	}
	assertNoToken(t, br)
}
