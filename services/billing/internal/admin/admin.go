// Package admin is billing's privileged operator surface. Its own repairs,
// the invoice jobs (pkg/leasequeue: list, retry dead ones), are the gRPC
// service lossless.billing.v1.BillingAdminService (Service, operator token
// from env BILLING_OPERATOR_TOKEN via pkg/operator's Guard) and the command
// line (RunCLI, `billing jobs retry`). The outbox, the intake's parked
// messages and dead letters and the operator_audit log are the one operator
// API, lossless.ops.v1.OperatorService (pkg/operator over OperatorDeps,
// consumer intake): mounted by the app, and run in process by the CLI
// (`billing outbox|parked|dead-letters|audit ...`, operator.RunCLI). Every
// repair needs a ticket and an actor and is audited in operator_audit, dry
// runs included.
package admin

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/operator"
)

// EnvOperatorToken names the environment variable holding the operator token.
const EnvOperatorToken = "BILLING_OPERATOR_TOKEN"

// Page sizes of the listings, as the proto documents them.
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// Service implements BillingAdminService. Register it with
// billingv1.RegisterBillingAdminServiceServer and install AuthInterceptor.
type Service struct {
	billingv1.UnimplementedBillingAdminServiceServer
	ops   *Ops
	guard *operator.Guard
}

// NewService returns the admin service over ops. token is the operator token
// (EnvOperatorToken): empty refuses every call, shorter than
// operator.MinTokenLength is an error.
func NewService(ops *Ops, token string, logger *slog.Logger) (*Service, error) {
	if ops == nil || logger == nil {
		return nil, errors.New("admin: NewService needs ops and a logger")
	}
	guard, err := operator.NewGuard(token, EnvOperatorToken, logger)
	if err != nil {
		return nil, err
	}
	return &Service{ops: ops, guard: guard}, nil
}

// AuthInterceptor refuses calls to this service without the operator token
// before anything else runs, request validation included. Other services
// on the server pass through.
func (s *Service) AuthInterceptor() grpc.UnaryServerInterceptor {
	return s.guard.ServiceInterceptor(billingv1.BillingAdminService_ServiceDesc.ServiceName)
}

func pageSize(n int32) int {
	if n <= 0 {
		return defaultPageSize
	}
	return min(int(n), maxPageSize)
}

// ListInvoiceJobs implements BillingAdminService.
func (s *Service) ListInvoiceJobs(ctx context.Context, req *billingv1.ListInvoiceJobsRequest) (*billingv1.ListInvoiceJobsResponse, error) {
	if err := s.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	filter := []string{req.GetState(), req.GetWorkOrderId()}
	before, err := operator.DecodePageTokenID(req.GetPageToken(), filter...)
	if err != nil {
		return nil, err
	}
	size := pageSize(req.GetPageSize())
	// One more than asked for tells whether another page follows. The job's
	// unique key is its work order id.
	jobs, err := s.ops.queue.List(ctx, s.ops.db, leasequeue.ListFilter{State: leasequeue.State(req.GetState()),
		UniqueKey: req.GetWorkOrderId(), BeforeID: before, Limit: size + 1})
	if err != nil {
		return nil, err
	}
	resp := &billingv1.ListInvoiceJobsResponse{}
	if len(jobs) > size {
		jobs = jobs[:size]
		resp.NextPageToken = operator.EncodePageToken(jobs[size-1].ID, filter...)
	}
	for _, j := range jobs {
		resp.Jobs = append(resp.Jobs, &billingv1.InvoiceJob{
			Id: j.ID, WorkOrderId: j.UniqueKey, State: string(j.State), Attempts: int32(j.Attempts),
			MaxAttempts: int32(j.MaxAttempts), Epoch: j.Epoch, LeaseOwner: j.LeaseOwner, DueTime: timestamppb.New(j.DueAt),
			LastError: j.LastError, CreateTime: timestamppb.New(j.CreatedAt), FinishTime: optTime(j.FinishedAt),
		})
	}
	return resp, nil
}

func optTime(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}
