package operator

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lossless-dev/lossless/pkg/leasequeue"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// ListJobs implements OperatorService over Deps.Jobs.
func (s *Service) ListJobs(ctx context.Context, req *opsv1.ListJobsRequest) (*opsv1.ListJobsResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	if s.deps.Jobs == nil {
		return nil, repairStatus(errNoStore("lease queue"))
	}
	filter := []string{req.GetState(), req.GetUniqueKey()}
	before, err := DecodePageTokenID(req.GetPageToken(), filter...)
	if err != nil {
		return nil, err
	}
	size := pageSize(req.GetPageSize())
	// One more than asked for tells whether another page follows.
	jobs, err := s.deps.Jobs.List(ctx, s.deps.DB, leasequeue.ListFilter{State: leasequeue.State(req.GetState()),
		UniqueKey: req.GetUniqueKey(), BeforeID: before, Limit: size + 1})
	if err != nil {
		return nil, err
	}
	resp := &opsv1.ListJobsResponse{}
	if len(jobs) > size {
		jobs = jobs[:size]
		resp.NextPageToken = EncodePageToken(jobs[size-1].ID, filter...)
	}
	for _, j := range jobs {
		resp.Jobs = append(resp.Jobs, &opsv1.Job{
			Id: j.ID, UniqueKey: j.UniqueKey, State: string(j.State), Attempts: int32(j.Attempts),
			MaxAttempts: int32(j.MaxAttempts), Epoch: j.Epoch, LeaseOwner: j.LeaseOwner, DueTime: timestamppb.New(j.DueAt),
			LastError: j.LastError, CreateTime: timestamppb.New(j.CreatedAt), FinishTime: optTime(j.FinishedAt),
		})
	}
	return resp, nil
}

// RetryJobs implements OperatorService: the dead jobs among ids requeued
// (pkg/leasequeue Retry), audited as jobs.retry.
func (s *Service) RetryJobs(ctx context.Context, req *opsv1.RetryJobsRequest) (*opsv1.RetryJobsResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	if s.deps.Jobs == nil {
		return nil, repairStatus(errNoStore("lease queue"))
	}
	ids, err := s.retryJobs(ctx, req.GetAuthorization(), req.GetIds(), req.GetDryRun())
	if err != nil {
		return nil, repairStatus(err)
	}
	return &opsv1.RetryJobsResponse{Ids: ids, DryRun: req.GetDryRun()}, nil
}
