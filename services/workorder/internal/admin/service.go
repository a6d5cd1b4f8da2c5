package admin

import (
	"context"
	"errors"
	"log/slog"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/operator"
)

// EnvOperatorToken names the environment variable holding the operator token.
const EnvOperatorToken = "WORKORDER_OPERATOR_TOKEN"

// Service implements WorkOrderAdminService. Register it with
// workorderv1.RegisterWorkOrderAdminServiceServer(srv.GRPC(), svc).
type Service struct {
	workorderv1.UnimplementedWorkOrderAdminServiceServer
	ops   *Ops
	guard *operator.Guard
}

// NewService returns the admin service. token is the break-glass operator
// token (from EnvOperatorToken), opts name the operator identities
// (operator.WithIdentities); with neither the service refuses every call,
// and a token shorter than operator.MinTokenLength is an error.
func NewService(ops *Ops, token string, logger *slog.Logger, opts ...operator.GuardOption) (*Service, error) {
	if ops == nil || logger == nil {
		return nil, errors.New("admin: NewService needs ops and a logger")
	}
	guard, err := operator.NewGuard(token, EnvOperatorToken, logger, opts...)
	if err != nil {
		return nil, err
	}
	return &Service{ops: ops, guard: guard}, nil
}

// AuthInterceptor refuses calls to this service without an operator's credential
// before anything else runs, request validation included: an unauthenticated
// caller gets UNAUTHENTICATED or PERMISSION_DENIED whatever its request, and
// nothing is read or changed. Other services on the server pass through.
func (s *Service) AuthInterceptor() grpc.UnaryServerInterceptor {
	return s.guard.ServiceInterceptor(workorderv1.WorkOrderAdminService_ServiceDesc.ServiceName)
}

// toStatus maps the repair's domain errors to gRPC codes. Anything else (a
// database outage, a bug) is returned as is, for pkg/server's public error
// mapper (apierror.Public): an outage is UNAVAILABLE with a retry hint, any
// other failure a bare INTERNAL with a reference, and the driver's text
// (SQL, hosts, user names) is logged, never sent.
func toStatus(err error) error {
	switch {
	case errors.Is(err, ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrOrderNotHandedOff):
		return status.Error(codes.FailedPrecondition, err.Error())
	default:
		return err
	}
}

// RecordReHandOff implements WorkOrderAdminService.
func (s *Service) RecordReHandOff(ctx context.Context, req *workorderv1.RecordReHandOffRequest) (*workorderv1.RecordReHandOffResponse, error) {
	ctx, err := s.guard.Verify(ctx)
	if err != nil {
		return nil, err
	}
	id, err := uuid.Parse(req.GetWorkOrderId())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "work_order_id must be a UUID")
	}
	a := req.GetAuthorization()
	wp, open, err := s.ops.RecordReHandOff(ctx, a.GetTicket(), a.GetActor(), id)
	if err != nil {
		return nil, toStatus(err)
	}
	return &workorderv1.RecordReHandOffResponse{WaitingPointId: wp, OpenWaitingPoints: int32(open)}, nil
}
