// Package api serves lossless.billing.v1.BillingService: read-only access to
// the invoices billing issued. Requests are validated by pkg/server's
// protovalidate interceptor before they reach the handlers (INVALID_ARGUMENT
// with one field violation per bad field; HTTP 400 through the gateway).
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/billing/internal/invoice"
	"github.com/lossless-dev/lossless/services/billing/internal/store"
)

// Page sizes of ListInvoices.
const (
	DefaultPageSize = 50
	MaxPageSize     = 500
)

// Service implements BillingService.
type Service struct {
	billingv1.UnimplementedBillingServiceServer
	db     pgdb.Executor
	logger *slog.Logger
}

// NewService returns the service reading from db.
func NewService(db pgdb.Executor, logger *slog.Logger) (*Service, error) {
	if db == nil || logger == nil {
		return nil, errors.New("api: nil database or logger")
	}
	return &Service{db: db, logger: logger}, nil
}

// Register registers svc on the gRPC server and its REST gateway.
func Register(ctx context.Context, srv *server.Server, svc *Service) error {
	billingv1.RegisterBillingServiceServer(srv.GRPC(), svc)
	if err := billingv1.RegisterBillingServiceHandler(ctx, srv.Gateway(), srv.GatewayConn()); err != nil {
		return fmt.Errorf("api: register gateway: %w", err)
	}
	return nil
}

// Policy is the authorization rule of every BillingService method
// (docs/adr/0025-authorization.md): each is a client's, reading only its
// customers' invoices. A method added to the service needs its line here,
// or it is refused (and the app does not start).
func Policy() authz.Policy {
	return authz.Policy{
		billingv1.BillingService_GetInvoice_FullMethodName:   authz.Client,
		billingv1.BillingService_ListInvoices_FullMethodName: authz.Client,
	}
}

// GetInvoice returns one invoice; NOT_FOUND when unknown, or of a customer
// the caller does not act for (its existence does not leak).
func (s *Service) GetInvoice(ctx context.Context, req *billingv1.GetInvoiceRequest) (*billingv1.GetInvoiceResponse, error) {
	id, err := uuid.Parse(req.GetId())
	if err != nil { // protovalidate already refused it; kept for direct callers
		return nil, apierror.InvalidArgument(apierror.Violation{Field: "id", Description: "value must be a valid UUID"})
	}
	inv, err := store.Get(ctx, s.db, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, apierror.NotFound("invoice", req.GetId())
	}
	if err != nil {
		// pkg/server's interceptor answers UNAVAILABLE or a bare INTERNAL
		// and logs this; the client never sees the driver's text.
		return nil, fmt.Errorf("get invoice %s: %w", id, err)
	}
	if !authz.MayActFor(ctx, inv.CustomerID) {
		return nil, apierror.NotFound("invoice", req.GetId())
	}
	return &billingv1.GetInvoiceResponse{Invoice: toProto(inv)}, nil
}

// ListInvoices pages invoices newest first, by work order and/or issue
// time, of the customers the caller acts for only.
func (s *Service) ListInvoices(ctx context.Context, req *billingv1.ListInvoicesRequest) (*billingv1.ListInvoicesResponse, error) {
	p, ok := authz.FromContext(ctx)
	if !ok || p.Kind != authz.KindClient {
		// Built without the authorizer: refuse rather than list everything.
		return nil, status.Error(codes.Unauthenticated, "no authorized caller")
	}
	// In SQL, not after it: a page filtered afterwards could be short or
	// empty while more follow.
	f := store.Filter{Limit: int(req.GetPageSize()), Customers: p.Customers.IDs()}
	if f.Limit == 0 {
		f.Limit = DefaultPageSize
	}
	f.Limit = min(f.Limit, MaxPageSize)
	if req.GetWorkOrderId() != "" {
		id, err := uuid.Parse(req.GetWorkOrderId())
		if err != nil {
			return nil, apierror.InvalidArgument(apierror.Violation{Field: "work_order_id", Description: "value must be a valid UUID"})
		}
		f.WorkOrderID = id
	}
	if req.GetIssuedAfter() != nil {
		f.IssuedAfter = req.GetIssuedAfter().AsTime()
	}
	if req.GetIssuedBefore() != nil {
		f.IssuedBefore = req.GetIssuedBefore().AsTime()
	}
	if tok := req.GetPageToken(); tok != "" {
		c, err := store.ParseToken(tok)
		if err == nil && !plausibleIssueTime(c.IssuedAt, time.Now()) {
			err = errors.New("page token out of range")
		}
		if err != nil {
			return nil, apierror.InvalidArgument(apierror.Violation{Field: "page_token", Description: err.Error()})
		}
		f.After = &c
	}
	invs, next, err := store.List(ctx, s.db, f)
	if err != nil {
		return nil, fmt.Errorf("list invoices: %w", err) // see GetInvoice
	}
	resp := &billingv1.ListInvoicesResponse{Invoices: make([]*billingv1.Invoice, len(invs))}
	for i, inv := range invs {
		resp.Invoices[i] = toProto(inv)
	}
	if next != nil {
		resp.NextPageToken = next.Token()
	}
	return resp, nil
}

// maxTokenSkew is how far past now a page token's time may lie: tokens carry
// the database's issue times, and replicas' clocks differ a little.
const maxTokenSkew = 24 * time.Hour

// plausibleIssueTime reports whether t can be an invoice's issue time: not
// before 1970, not in the future. A token with any other time was not issued
// by a previous response, and its extremes overflow PostgreSQL's timestamptz
// (the driver then silently queries some other position).
func plausibleIssueTime(t, now time.Time) bool {
	return !t.Before(time.Unix(0, 0)) && !t.After(now.Add(maxTokenSkew))
}

func toProto(inv invoice.Invoice) *billingv1.Invoice {
	money := func(minor int64) *moneyv1.Money {
		return &moneyv1.Money{CurrencyCode: inv.Currency, MinorUnits: minor}
	}
	out := &billingv1.Invoice{
		Id:          inv.ID.String(),
		Number:      inv.Number,
		WorkOrderId: inv.WorkOrderID.String(),
		CustomerId:  inv.CustomerID,
		Total:       money(inv.TotalMinor),
		IssueTime:   timestamppb.New(inv.IssuedAt),
	}
	for _, l := range inv.Lines {
		out.Lines = append(out.Lines, &billingv1.InvoiceLine{
			Description: l.Description,
			Quantity:    l.Quantity,
			UnitPrice:   money(l.UnitPriceMinor),
			Amount:      money(l.AmountMinor),
		})
	}
	return out
}
