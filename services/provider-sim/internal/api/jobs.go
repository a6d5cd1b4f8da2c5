package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/operator"
)

// Page sizes of ListJobs, as the proto documents them.
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// OpenAdminMethods are the ProviderAdminService methods callable without
// the operator token: reading the knobs. Every other method of the service
// needs it (operator.Guard.ServiceInterceptor), so a method added later is
// guarded until it is named here: changing the knobs can crash-loop the
// simulator, and the jobs show customers' orders. ProviderService (the
// hand-off the work-order relay calls) is another service and stays open.
func OpenAdminMethods() []string { return []string{"GetFaults"} }

const jobReadColumns = `job_id, work_order_id, customer_id, positions, status, attempts, coalesce(last_error, ''),
       coalesce(lease_owner, ''), lease_token, lease_until, not_before,
       fault_early_completion, fault_duplicate, fault_split_first, fault_poison, fault_unknown_order, fault_crash_pending,
       accepted_at, started_at, completed_at`

// Job ids are UUIDv7, ordered by acceptance time: newest first is job_id
// DESC, a walk of the primary key, and the keyset position is the last id.
const listJobs = `SELECT ` + jobReadColumns + `
  FROM jobs
 WHERE ($1 = '' OR status = $1) AND ($2::uuid IS NULL OR job_id < $2)
 ORDER BY job_id DESC
 LIMIT $3`

// A query of its own rather than "$n IS NULL OR work_order_id = $n" in
// listJobs: a cached generic plan of that OR could not use the unique index.
const listJobsOfWorkOrder = `SELECT ` + jobReadColumns + `
  FROM jobs
 WHERE work_order_id = $1 AND ($2 = '' OR status = $2) AND ($3::uuid IS NULL OR job_id < $3)`

const getJob = `SELECT ` + jobReadColumns + ` FROM jobs WHERE job_id = $1`

// job_events_job_seq_key (job_id, seq) serves it.
const listJobMessages = `SELECT event_id, seq, kind, event_type, ordering_key, copies, publish_count, occurred_at, published_at
  FROM job_events WHERE job_id = $1 ORDER BY seq`

func scanJob(row pgx.Row) (*providerv1.Job, error) {
	var (
		id, order                   uuid.UUID
		leaseUntil                  *time.Time
		notBefore, accepted         time.Time
		started, completed          *time.Time
		j                           = &providerv1.Job{Faults: &providerv1.JobFaults{}}
		f                           = j.Faults
		customer, state, lastErr    string
		owner, poison               string
		positions, attempts, splitN int32
	)
	err := row.Scan(&id, &order, &customer, &positions, &state, &attempts, &lastErr, &owner, &j.LeaseEpoch, &leaseUntil,
		&notBefore, &f.EarlyCompletion, &f.Duplicate, &splitN, &poison, &f.UnknownOrder, &f.PublishThenCrashPending,
		&accepted, &started, &completed)
	if err != nil {
		return nil, err
	}
	j.JobId, j.WorkOrderId, j.CustomerId, j.Positions, j.State = id.String(), order.String(), customer, positions, state
	j.Attempts, j.LastError, j.LeaseOwner = attempts, lastErr, owner
	j.LeaseExpireTime, j.StartTime, j.CompleteTime = optTime(leaseUntil), optTime(started), optTime(completed)
	j.NextAttemptTime, j.AcceptTime = timestamppb.New(notBefore), timestamppb.New(accepted)
	f.SplitFirstItems, f.Poison = splitN, poison
	return j, nil
}

func optTime(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

// ListJobs implements ProviderAdminService. The operator token is checked
// by the server's interceptor (OperatorMethods), request validation by its
// protovalidate interceptor; the page token here.
func (a *Admin) ListJobs(ctx context.Context, req *providerv1.ListJobsRequest) (*providerv1.ListJobsResponse, error) {
	filter := []string{req.GetWorkOrderId(), req.GetState()}
	var last string
	ok, err := operator.DecodePageToken(req.GetPageToken(), &last, filter...)
	var before *uuid.UUID
	if err == nil && ok {
		id, perr := uuid.Parse(last)
		if perr != nil {
			err = operator.ErrPageTokenMalformed
		}
		before = &id
	}
	if err != nil {
		return nil, apierror.InvalidArgument(apierror.Violation{Field: "page_token", Description: err.Error()})
	}
	size := defaultPageSize
	if n := int(req.GetPageSize()); n > 0 {
		size = min(n, maxPageSize)
	}
	var rows pgx.Rows
	if req.GetWorkOrderId() != "" {
		order, perr := uuid.Parse(req.GetWorkOrderId())
		if perr != nil {
			return nil, apierror.InvalidArgument(apierror.Violation{Field: "work_order_id", Description: "must be a UUID"})
		}
		rows, err = a.db.Query(ctx, listJobsOfWorkOrder, order, req.GetState(), before)
	} else {
		// One more than asked for tells whether another page follows.
		rows, err = a.db.Query(ctx, listJobs, req.GetState(), before, size+1)
	}
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*providerv1.Job, error) { return scanJob(r) })
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	resp := &providerv1.ListJobsResponse{Jobs: jobs}
	if len(jobs) > size {
		resp.Jobs = jobs[:size]
		resp.NextPageToken = operator.EncodePageToken(jobs[size-1].GetJobId(), filter...)
	}
	return resp, nil
}

// GetJob implements ProviderAdminService.
func (a *Admin) GetJob(ctx context.Context, req *providerv1.GetJobRequest) (*providerv1.GetJobResponse, error) {
	id, err := uuid.Parse(req.GetJobId())
	if err != nil {
		return nil, apierror.InvalidArgument(apierror.Violation{Field: "job_id", Description: "must be a UUID"})
	}
	// The job before its messages: they only move forward, so a job read
	// DONE comes with all its messages shown published.
	job, err := scanJob(a.db.QueryRow(ctx, getJob, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, apierror.NotFound("job", id.String())
	}
	if err != nil {
		return nil, fmt.Errorf("get job: %w", err)
	}
	rows, err := a.db.Query(ctx, listJobMessages, id)
	if err != nil {
		return nil, fmt.Errorf("get job messages: %w", err)
	}
	msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*providerv1.JobMessage, error) {
		var (
			eventID             uuid.UUID
			m                   providerv1.JobMessage
			occurred            time.Time
			published           *time.Time
			seq, copies, pubCnt int32
		)
		if err := r.Scan(&eventID, &seq, &m.Kind, &m.EventType, &m.OrderingKey, &copies, &pubCnt, &occurred, &published); err != nil {
			return nil, err
		}
		m.EventId, m.Sequence, m.Copies, m.PublishCount = eventID.String(), seq, copies, pubCnt
		m.OccurTime, m.PublishTime = timestamppb.New(occurred), optTime(published)
		return &m, nil
	})
	if err != nil {
		return nil, fmt.Errorf("get job messages: %w", err)
	}
	return &providerv1.GetJobResponse{Job: job, Messages: msgs}, nil
}
