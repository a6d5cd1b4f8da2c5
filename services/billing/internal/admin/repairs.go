package admin

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

// The repairs over gRPC: each calls the Ops method its CLI command calls.
// Request validation (the proto's rules: authorization required, ticket and
// actor 1..200 characters, bounded ids) has refused a malformed request
// with field violations before a handler runs.

func authorization(a *billingv1.OperatorAuthorization) Authorization {
	return Authorization{Ticket: a.GetTicket(), Actor: a.GetActor()}
}

// repairStatus maps a repair's error: the caller's mistakes and states that
// rule the repair out are not outages; anything else passes unchanged, so
// the server's edge reports an outage as UNAVAILABLE.
func repairStatus(err error) error {
	switch {
	case errors.Is(err, ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, parked.ErrNotOpen):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, intake.ErrStillRefused):
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return err
}

// RetryInvoiceJobs implements BillingAdminService.
func (s *Service) RetryInvoiceJobs(ctx context.Context, req *billingv1.RetryInvoiceJobsRequest) (*billingv1.RetryInvoiceJobsResponse, error) {
	if err := s.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	ids, err := s.ops.RetryJobs(ctx, RetryJobsRequest{Authorization: authorization(req.GetAuthorization()), IDs: req.GetIds(), DryRun: req.GetDryRun()})
	if err != nil {
		return nil, repairStatus(err)
	}
	return &billingv1.RetryInvoiceJobsResponse{Ids: ids, DryRun: req.GetDryRun()}, nil
}
