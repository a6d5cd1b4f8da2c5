package admin

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/internal/pagetoken"
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

// ReplayDeadLetters implements BillingAdminService.
func (s *Service) ReplayDeadLetters(ctx context.Context, req *billingv1.ReplayDeadLettersRequest) (*billingv1.ReplayDeadLettersResponse, error) {
	if err := s.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	res, err := s.ops.ReplayDeadLetters(ctx, DeadLetterRequest{Authorization: authorization(req.GetAuthorization()),
		MaxMessages: int(req.GetMaxMessages()), MessageIDs: req.GetMessageIds(), DryRun: req.GetDryRun()})
	if err != nil {
		return nil, repairStatus(err)
	}
	resp := &billingv1.ReplayDeadLettersResponse{MessageIds: res.MessageIDs, FailedMessageIds: res.Failed, DryRun: res.DryRun,
		Outcomes: map[string]int32{}}
	for k, n := range res.Outcomes {
		resp.Outcomes[k] = int32(n)
	}
	return resp, nil
}

// ReplayParkedMessage implements BillingAdminService.
func (s *Service) ReplayParkedMessage(ctx context.Context, req *billingv1.ReplayParkedMessageRequest) (*billingv1.ReplayParkedMessageResponse, error) {
	if err := s.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	outcome, err := s.ops.ReplayParked(ctx, ParkedReplayRequest{Authorization: authorization(req.GetAuthorization()),
		ID: req.GetId(), DryRun: req.GetDryRun()})
	if err != nil {
		return nil, repairStatus(err)
	}
	return &billingv1.ReplayParkedMessageResponse{Outcome: outcome, DryRun: req.GetDryRun()}, nil
}

// ListOperatorAudit implements BillingAdminService.
func (s *Service) ListOperatorAudit(ctx context.Context, req *billingv1.ListOperatorAuditRequest) (*billingv1.ListOperatorAuditResponse, error) {
	if err := s.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	filter := []string{req.GetAction(), req.GetActor(), req.GetTicket()}
	before, err := pagetoken.DecodeID(req.GetPageToken(), filter...)
	if err != nil {
		return nil, err
	}
	recs, more, err := s.ops.ListAudit(ctx, operator.AuditFilter{Action: req.GetAction(), Actor: req.GetActor(), Ticket: req.GetTicket(),
		BeforeID: before, Limit: pageSize(req.GetPageSize())})
	if err != nil {
		return nil, repairStatus(err)
	}
	resp := &billingv1.ListOperatorAuditResponse{Records: make([]*billingv1.OperatorAuditRecord, 0, len(recs))}
	for _, r := range recs {
		params, err := structpb.NewStruct(r.Params)
		if err != nil {
			return nil, err
		}
		resp.Records = append(resp.Records, &billingv1.OperatorAuditRecord{Id: r.ID, Action: r.Action, Actor: r.Actor,
			Ticket: r.Ticket, DryRun: r.DryRun, Params: params, Affected: int32(r.Affected), OccurTime: timestamppb.New(r.OccurredAt)})
	}
	if more {
		resp.NextPageToken = pagetoken.Encode(recs[len(recs)-1].ID, filter...)
	}
	return resp, nil
}
