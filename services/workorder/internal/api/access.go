package api

import (
	"context"
	"slices"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// Who may do what (docs/adr/0017-caller-identity.md): any authenticated
// caller creates orders and lists its own; an order is read and cancelled
// by its creator or an operator (Service.operators).

// ReasonNotYourOrder is the ErrorInfo reason of a call on an order the
// caller neither created nor may see as an operator.
const ReasonNotYourOrder = "WORK_ORDER_OF_ANOTHER_CALLER"

// caller is the verified caller of ctx's request, and whether it is an
// operator. No caller: the server was built without WithCallerAuth, and
// the API refuses rather than serve everyone as no one.
func (s *Service) caller(ctx context.Context) (server.Caller, bool, error) {
	c, ok := server.CallerFrom(ctx)
	if !ok || c.Subject == "" {
		return server.Caller{}, false, status.Error(codes.Unauthenticated, "no authenticated caller")
	}
	return c, slices.ContainsFunc(s.operators, c.Is), nil
}

// own loads the order id and checks that the caller may act on it: its
// creator or an operator. Ids are random UUIDs, so PERMISSION_DENIED for
// another's order tells nothing a caller could not learn from having the id.
func (s *Service) own(ctx context.Context, id uuid.UUID, rawID string) (orders.Order, error) {
	c, operator, err := s.caller(ctx)
	if err != nil {
		return orders.Order{}, err
	}
	o, err := s.repo.Get(ctx, id)
	if err != nil {
		return orders.Order{}, toStatus(err, rawID)
	}
	if !operator && o.CreatedBy != c.Subject {
		return orders.Order{}, apierror.PermissionDenied(ReasonNotYourOrder,
			"work order "+rawID+" was created by another caller: only its creator or an operator may use it")
	}
	return o, nil
}
