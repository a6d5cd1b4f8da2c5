// Package api is the work-order service's gRPC API (and, through
// grpc-gateway, its REST API): it decodes and checks requests, calls the
// orders package and maps the outcome to gRPC statuses. Field rules live in
// the proto (protovalidate), enforced by pkg/server's interceptor before a
// handler runs; a handler only checks what protovalidate cannot (the
// idempotency key header, the page token).
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// ReasonNotCancellable is the ErrorInfo reason of a cancel refused because
// the order was already handed off (or later).
const ReasonNotCancellable = "WORK_ORDER_NOT_CANCELLABLE"

// ReplayedHeader is set to "true" in the response metadata of a create
// answered from its idempotency key (HTTP: Grpc-Metadata-Idempotent-Replayed),
// as Stripe's Idempotent-Replayed header does.
const ReplayedHeader = "idempotent-replayed"

const (
	defaultPageSize = 50
	// createScope names CreateWorkOrder's idempotency keys; the caller's
	// subject is their principal (orders.CreateHandler), so each caller has
	// its own keys.
	createScope = workorderv1.WorkOrderService_CreateWorkOrder_FullMethodName
)

// Service implements workorderv1.WorkOrderServiceServer: it turns requests
// into the orders package's commands and reads, and their outcomes into
// responses and gRPC statuses.
type Service struct {
	workorderv1.UnimplementedWorkOrderServiceServer

	repo      *orders.Repository
	create    *orders.CreateHandler[*workorderv1.CreateWorkOrderResponse]
	cancel    *orders.CancelHandler
	operators []string
}

// NewService returns the API: reads through repo, creates and cancels
// through handlers writing on db, with create's idempotency keys in keys.
// operators name (by subject or verified email) the callers that may read, list and cancel every
// order (WORKORDER_OPERATOR_SUBJECTS); any other caller only its own. The
// caller is the one pkg/server's WithCallerAuth verified: a call that did
// not pass through it is refused. A nil meter disables metrics.
func NewService(db pgdb.DB, repo *orders.Repository, keys *idempotency.Store, operators []string, logger *slog.Logger, meter metric.Meter) (*Service, error) {
	switch {
	case db == nil:
		return nil, errors.New("api: database is nil")
	case repo == nil:
		return nil, errors.New("api: repository is nil")
	case keys == nil:
		return nil, errors.New("api: idempotency store is nil")
	case logger == nil:
		return nil, errors.New("api: logger is nil")
	}
	create, err := orders.NewCreateHandler(db, keys, createScope, func(o orders.Order) *workorderv1.CreateWorkOrderResponse {
		return &workorderv1.CreateWorkOrderResponse{WorkOrder: toProto(o)}
	}, logger, meter)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	cancel, err := orders.NewCancelHandler(db, logger, meter)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	return &Service{repo: repo, create: create, cancel: cancel, operators: slices.Clone(operators)}, nil
}

// Register serves svc on srv: gRPC, and REST through srv's gateway, which
// calls the gRPC server over loopback so REST requests pass the same
// interceptors (validation) as gRPC ones.
func Register(ctx context.Context, srv *server.Server, svc *Service) error {
	workorderv1.RegisterWorkOrderServiceServer(srv.GRPC(), svc)
	if err := workorderv1.RegisterWorkOrderServiceHandler(ctx, srv.Gateway(), srv.GatewayConn()); err != nil {
		return fmt.Errorf("api: register gateway: %w", err)
	}
	return nil
}

// CreateWorkOrder creates an order (orders.CreateHandler); with an
// idempotency key, a retry is answered from the key, with ReplayedHeader.
func (s *Service) CreateWorkOrder(ctx context.Context, req *workorderv1.CreateWorkOrderRequest) (*workorderv1.CreateWorkOrderResponse, error) {
	key, hasKey, err := idempotency.KeyFromIncomingContext(ctx)
	if err != nil {
		return nil, idempotency.StatusError(err)
	}
	c, _, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	// Before anything is written, the idempotency key included: a refused
	// request leaves no trace a retry could replay.
	if cust := req.GetWorkOrder().GetCustomerId(); !c.Customers.Has(cust) {
		return nil, authz.RefuseCustomer("work_order.customer_id", cust)
	}
	req = withoutOutputOnly(req)
	order, err := fromCreateRequest(req)
	if err != nil {
		return nil, toStatus(err, "")
	}
	order.CreatedBy = c.Caller.Subject
	cmd := orders.CreateOrder{Order: order}
	if hasKey {
		cmd.IdempotencyKey, cmd.Request = key, req
	}
	resp, replayed, err := s.create.Handle(ctx, cmd)
	if err != nil {
		return nil, toStatus(err, "")
	}
	if replayed {
		// Best effort: the response is right whether or not the header arrives.
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true"))
	}
	return resp, nil
}

// GetWorkOrder returns one order.
func (s *Service) GetWorkOrder(ctx context.Context, req *workorderv1.GetWorkOrderRequest) (*workorderv1.GetWorkOrderResponse, error) {
	id, err := parseID(req.GetId())
	if err != nil {
		return nil, err
	}
	o, err := s.own(ctx, id, req.GetId())
	if err != nil {
		return nil, err
	}
	return &workorderv1.GetWorkOrderResponse{WorkOrder: toProto(o)}, nil
}

// ListWorkOrders returns a page of the caller's orders (an operator's:
// every order), newest first; only orders of the caller's customers.
func (s *Service) ListWorkOrders(ctx context.Context, req *workorderv1.ListWorkOrdersRequest) (*workorderv1.ListWorkOrdersResponse, error) {
	c, operator, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	// The caller's customers filter the page in SQL: filtered after the
	// query, a page could come back short or empty with more to follow.
	q := orders.ListQuery{Customers: c.Customers.IDs()}
	if !operator {
		q.CreatedBy = c.Caller.Subject
	}
	filter := fromProtoStatus(req.GetStatus())
	after, err := decodePageToken(req.GetPageToken(), filter, time.Now())
	if err != nil {
		return nil, apierror.InvalidArgument(apierror.Violation{Field: "page_token", Description: err.Error()})
	}
	size := int(req.GetPageSize())
	if size == 0 {
		size = defaultPageSize
	}
	q.Status, q.After, q.Limit = filter, after, size
	list, next, err := s.repo.List(ctx, q)
	if err != nil {
		return nil, toStatus(err, "")
	}
	resp := &workorderv1.ListWorkOrdersResponse{WorkOrders: make([]*workorderv1.WorkOrder, 0, len(list))}
	for _, o := range list {
		resp.WorkOrders = append(resp.WorkOrders, toProto(o))
	}
	if next != nil {
		resp.NextPageToken = encodePageToken(*next, filter)
	}
	return resp, nil
}

// CancelWorkOrder cancels an order that has not been handed off
// (orders.CancelHandler). A cancelled order is returned unchanged
// (idempotent). Handed off or later: FAILED_PRECONDITION with reason
// WORK_ORDER_NOT_CANCELLABLE. Only its creator or an operator may cancel it
// (the creator never changes, so the check needs no lock).
func (s *Service) CancelWorkOrder(ctx context.Context, req *workorderv1.CancelWorkOrderRequest) (*workorderv1.CancelWorkOrderResponse, error) {
	id, err := parseID(req.GetId())
	if err != nil {
		return nil, err
	}
	if _, err := s.own(ctx, id, req.GetId()); err != nil {
		return nil, err
	}
	o, err := s.cancel.Handle(ctx, orders.CancelOrder{ID: id, Reason: req.GetReason()})
	if err != nil {
		return nil, toStatus(err, req.GetId())
	}
	return &workorderv1.CancelWorkOrderResponse{WorkOrder: toProto(o)}, nil
}

// ListWorkOrderHistory returns every transition of an order, oldest first.
func (s *Service) ListWorkOrderHistory(ctx context.Context, req *workorderv1.ListWorkOrderHistoryRequest) (*workorderv1.ListWorkOrderHistoryResponse, error) {
	id, err := parseID(req.GetId())
	if err != nil {
		return nil, err
	}
	if _, err := s.own(ctx, id, req.GetId()); err != nil {
		return nil, err
	}
	history, err := s.repo.History(ctx, id)
	if err != nil {
		return nil, toStatus(err, req.GetId())
	}
	resp := &workorderv1.ListWorkOrderHistoryResponse{Transitions: make([]*workorderv1.StatusTransition, 0, len(history))}
	for _, t := range history {
		resp.Transitions = append(resp.Transitions, toProtoTransition(t))
	}
	return resp, nil
}

// parseID parses an id protovalidate has already checked; the check here only
// guards against a handler called without the interceptor.
func parseID(id string) (uuid.UUID, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return uuid.Nil, apierror.InvalidArgument(apierror.Violation{Field: "id", Description: "must be a UUID"})
	}
	return u, nil
}

// toStatus maps domain errors to the API's gRPC errors. Anything else
// (database outages, bugs) is returned as is: pkg/server's interceptor turns
// it into UNAVAILABLE or a bare INTERNAL (apierror.Public) and logs it, so
// clients never see database details.
func toStatus(err error, id string) error {
	var stateErr *orders.IllegalTransitionError
	switch {
	case errors.Is(err, orders.ErrNotFound):
		return apierror.NotFound("work order", id)
	case errors.As(err, &stateErr):
		return apierror.FailedPrecondition(ReasonNotCancellable, stateErr.Error())
	case errors.Is(err, idempotency.ErrMismatch), errors.Is(err, idempotency.ErrInFlight), errors.Is(err, idempotency.ErrInvalidKey):
		return idempotency.StatusError(err)
	}
	return err
}
