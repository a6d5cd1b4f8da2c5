package admin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/internal/pagetoken"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// readStatus maps a listing's error: a filter out of range is the caller's
// (request validation refuses it first on a served API); anything else
// passes unchanged, so the server's edge reports an outage as UNAVAILABLE.
func readStatus(err error) error {
	if errors.Is(err, outbox.ErrInvalidFilter) || errors.Is(err, operator.ErrInvalidAuditFilter) {
		return apierror.InvalidArgument(apierror.Violation{Field: "page_size", Description: err.Error()})
	}
	return err
}

// ListOutboxEvents implements WorkOrderAdminService.
func (s *Service) ListOutboxEvents(ctx context.Context, req *workorderv1.ListOutboxEventsRequest) (*workorderv1.ListOutboxEventsResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	// The token is bound to the set of states, whatever their order.
	states := slices.Clone(req.GetStates())
	slices.Sort(states)
	filter := []string{joinStates(states), req.GetAggregateId(), req.GetEventType()}
	after, err := pagetoken.DecodeID(req.GetPageToken(), filter...)
	if err != nil {
		return nil, err
	}
	f := outbox.ListFilter{AggregateID: req.GetAggregateId(), Type: req.GetEventType(), AfterSeq: after, Limit: int(req.GetPageSize())}
	for _, st := range states {
		f.States = append(f.States, outbox.State(st))
	}
	recs, more, err := s.ops.Outbox().List(ctx, f)
	if err != nil {
		return nil, readStatus(err)
	}
	resp := &workorderv1.ListOutboxEventsResponse{Events: make([]*workorderv1.OutboxEvent, 0, len(recs))}
	for i := range recs {
		resp.Events = append(resp.Events, outboxToProto(&recs[i]))
	}
	if more {
		resp.NextPageToken = pagetoken.Encode(recs[len(recs)-1].Seq, filter...)
	}
	return resp, nil
}

// joinStates is the filter value of a set of states; a state never
// contains a comma (request validation allows three fixed names).
func joinStates(states []string) string { return strings.Join(states, ",") }

func optTime(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

// ListOperatorAudit implements WorkOrderAdminService.
func (s *Service) ListOperatorAudit(ctx context.Context, req *workorderv1.ListOperatorAuditRequest) (*workorderv1.ListOperatorAuditResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	filter := []string{req.GetAction(), req.GetActor(), req.GetTicket()}
	before, err := pagetoken.DecodeID(req.GetPageToken(), filter...)
	if err != nil {
		return nil, err
	}
	recs, more, err := s.ops.ListAudit(ctx, operator.AuditFilter{Action: req.GetAction(), Actor: req.GetActor(), Ticket: req.GetTicket(),
		BeforeID: before, Limit: int(req.GetPageSize())})
	if err != nil {
		return nil, readStatus(err)
	}
	resp := &workorderv1.ListOperatorAuditResponse{Records: make([]*workorderv1.OperatorAuditRecord, 0, len(recs))}
	for _, r := range recs {
		params, err := structpb.NewStruct(r.Params)
		if err != nil {
			return nil, err
		}
		resp.Records = append(resp.Records, &workorderv1.OperatorAuditRecord{Id: r.ID, Action: r.Action, Actor: r.Actor,
			Ticket: r.Ticket, DryRun: r.DryRun, Params: params, Affected: int32(r.Affected), OccurTime: timestamppb.New(r.OccurredAt)})
	}
	if more {
		resp.NextPageToken = pagetoken.Encode(recs[len(recs)-1].ID, filter...)
	}
	return resp, nil
}

func outboxToProto(r *outbox.Record) *workorderv1.OutboxEvent {
	return &workorderv1.OutboxEvent{
		EventId: r.EventID.String(), Sequence: r.Seq, AggregateType: r.AggregateType, AggregateId: r.AggregateID,
		EventType: r.Type, SchemaVersion: int32(r.SchemaVersion), State: string(r.State), Attempts: int32(r.Attempts),
		LastError: r.LastError, NextAttemptTime: optTime(r.NextAttemptAt), LeaseOwner: r.LeaseOwner,
		LeaseExpireTime: optTime(r.LeaseUntil), OccurTime: timestamppb.New(r.OccurredAt),
		CreateTime: timestamppb.New(r.CreatedAt), PublishTime: optTime(r.PublishedAt),
	}
}
