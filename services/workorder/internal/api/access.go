package api

import (
	"context"
	"slices"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// Who may do what (docs/adr/0025-authorization.md, 0017): Policy admits
// the clients of AUTH_CLIENTS (and the operators, as clients of every
// customer); a client creates orders only for its customers and sees only
// their orders (another customer's is NOT_FOUND, as an unknown id); among
// those, an order is read and cancelled by its creator or an operator
// (Service.operators).

// Policy is the authorization rule of every WorkOrderService method: each
// is a client's. A method added to the service needs its line here, or it
// is refused (and the app does not start).
func Policy() authz.Policy {
	return authz.Policy{
		workorderv1.WorkOrderService_CreateWorkOrder_FullMethodName:      authz.Client,
		workorderv1.WorkOrderService_GetWorkOrder_FullMethodName:         authz.Client,
		workorderv1.WorkOrderService_ListWorkOrders_FullMethodName:       authz.Client,
		workorderv1.WorkOrderService_CancelWorkOrder_FullMethodName:      authz.Client,
		workorderv1.WorkOrderService_ListWorkOrderHistory_FullMethodName: authz.Client,
	}
}

// ReasonNotYourOrder is the ErrorInfo reason of a call on an order of one
// of the caller's customers that the caller neither created nor may see as
// an operator.
const ReasonNotYourOrder = "WORK_ORDER_OF_ANOTHER_CALLER"

// caller is the principal of ctx's request, as the authorizer admitted
// it, and whether it is an operator. No client principal: the server was
// built without the authorizer, and the API refuses rather than serve
// everyone as no one.
func (s *Service) caller(ctx context.Context) (authz.Principal, bool, error) {
	p, ok := authz.FromContext(ctx)
	if !ok || p.Kind != authz.KindClient || p.Caller.Subject == "" {
		return authz.Principal{}, false, status.Error(codes.Unauthenticated, "no authorized caller")
	}
	return p, slices.ContainsFunc(s.operators, p.Caller.Is), nil
}

// own loads the order id and checks that the caller may act on it. An
// order of a customer the caller does not act for is NOT_FOUND, like an
// unknown id: its existence does not leak across customers. Within its
// customers, only its creator or an operator uses it; PERMISSION_DENIED
// there tells nothing a caller could not learn from having the random id.
func (s *Service) own(ctx context.Context, id uuid.UUID, rawID string) (orders.Order, error) {
	p, operator, err := s.caller(ctx)
	if err != nil {
		return orders.Order{}, err
	}
	o, err := s.repo.Get(ctx, id)
	if err != nil {
		return orders.Order{}, toStatus(err, rawID)
	}
	if !p.Customers.Has(o.CustomerID) {
		return orders.Order{}, toStatus(orders.ErrNotFound, rawID)
	}
	if !operator && o.CreatedBy != p.Caller.Subject {
		return orders.Order{}, apierror.PermissionDenied(ReasonNotYourOrder,
			"work order "+rawID+" was created by another caller: only its creator or an operator may use it")
	}
	return o, nil
}
