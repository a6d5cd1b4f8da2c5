package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/internal/pagetoken"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/outbox"
)

// Billing's outbox (InvoiceIssued): the operator read of its events and the
// requeue of FAILED ones (docs/runbooks/outbox-relay-stalled.md, Remediation
// step 3), from the CLI (`billing outbox requeue`) and over gRPC.

// OutboxRequeueRequest names FAILED outbox events to requeue.
type OutboxRequeueRequest struct {
	Authorization
	// EventIDs of the events, 1..outbox.MaxRequeueEvents; only FAILED ones
	// are touched.
	EventIDs []uuid.UUID
	// DryRun reports which of the events are FAILED and would be requeued;
	// nothing changes but the audit row.
	DryRun bool
}

// RequeueOutbox moves the FAILED events among EventIDs back to PENDING with
// a fresh attempt budget (outbox.Requeuer: "requeued by <actor>, ticket
// <ticket>; was: <error>" in last_error) and audits the call in
// operator_audit (action outbox.requeue), a dry run too, in the same
// transaction.
func (o *Ops) RequeueOutbox(ctx context.Context, req OutboxRequeueRequest) (res outbox.RequeueResult, err error) {
	if err := req.Validate(); err != nil {
		return outbox.RequeueResult{}, err
	}
	note := fmt.Sprintf("requeued by %s, ticket %s", strings.TrimSpace(req.Actor), strings.TrimSpace(req.Ticket))
	err = pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
		res, err = o.requeue.Requeue(ctx, tx, outbox.RequeueRequest{EventIDs: req.EventIDs, Note: note, DryRun: req.DryRun})
		if err != nil {
			return err
		}
		requested := make([]string, len(req.EventIDs))
		for i, id := range req.EventIDs {
			requested[i] = id.String()
		}
		skipped := map[string]string{}
		for _, s := range res.Skipped {
			skipped[s.EventID.String()] = string(s.State)
		}
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "outbox.requeue", Actor: req.Actor, Ticket: req.Ticket,
			DryRun: req.DryRun, Params: map[string]any{"requested": requested, "requeued": requeuedIDs(res), "skipped": skipped},
			Affected: len(res.Requeued)})
	})
	if errors.Is(err, outbox.ErrInvalidRequeue) {
		return outbox.RequeueResult{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if err != nil {
		return outbox.RequeueResult{}, err
	}
	return res, nil
}

func requeuedIDs(res outbox.RequeueResult) []string {
	ids := make([]string, len(res.Requeued))
	for i, ev := range res.Requeued {
		ids[i] = ev.EventID.String()
	}
	return ids
}

// parseEventIDs parses outbox event ids (request validation has checked
// them on a served API).
func parseEventIDs(ss []string) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, 0, len(ss))
	for _, s := range ss {
		id, err := uuid.Parse(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%w: event id %q is not a UUID", ErrInvalidRequest, s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// RequeueOutboxEvents implements BillingAdminService.
func (s *Service) RequeueOutboxEvents(ctx context.Context, req *billingv1.RequeueOutboxEventsRequest) (*billingv1.RequeueOutboxEventsResponse, error) {
	if err := s.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	ids, err := parseEventIDs(req.GetEventIds())
	if err != nil {
		return nil, repairStatus(err)
	}
	res, err := s.ops.RequeueOutbox(ctx, OutboxRequeueRequest{Authorization: authorization(req.GetAuthorization()), EventIDs: ids, DryRun: req.GetDryRun()})
	if err != nil {
		return nil, repairStatus(err)
	}
	resp := &billingv1.RequeueOutboxEventsResponse{EventIds: requeuedIDs(res), DryRun: res.DryRun}
	for _, sk := range res.Skipped {
		resp.Skipped = append(resp.Skipped, &billingv1.SkippedOutboxEvent{EventId: sk.EventID.String(), State: string(sk.State)})
	}
	return resp, nil
}

// ListOutboxEvents implements BillingAdminService.
func (s *Service) ListOutboxEvents(ctx context.Context, req *billingv1.ListOutboxEventsRequest) (*billingv1.ListOutboxEventsResponse, error) {
	if err := s.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	// The token is bound to the set of states, whatever their order; a
	// state never contains a comma (request validation allows three names).
	states := slices.Clone(req.GetStates())
	slices.Sort(states)
	filter := []string{strings.Join(states, ","), req.GetAggregateId(), req.GetEventType()}
	after, err := pagetoken.DecodeID(req.GetPageToken(), filter...)
	if err != nil {
		return nil, err
	}
	f := outbox.ListFilter{AggregateID: req.GetAggregateId(), Type: req.GetEventType(), AfterSeq: after, Limit: int(req.GetPageSize())}
	for _, st := range states {
		f.States = append(f.States, outbox.State(st))
	}
	recs, more, err := s.ops.outbox.List(ctx, f)
	if errors.Is(err, outbox.ErrInvalidFilter) {
		return nil, apierror.InvalidArgument(apierror.Violation{Field: "page_size", Description: err.Error()})
	}
	if err != nil {
		return nil, err
	}
	resp := &billingv1.ListOutboxEventsResponse{Events: make([]*billingv1.OutboxEvent, 0, len(recs))}
	for _, r := range recs {
		resp.Events = append(resp.Events, &billingv1.OutboxEvent{
			EventId: r.EventID.String(), Sequence: r.Seq, AggregateType: r.AggregateType, AggregateId: r.AggregateID,
			EventType: r.Type, SchemaVersion: int32(r.SchemaVersion), State: string(r.State), Attempts: int32(r.Attempts),
			LastError: r.LastError, NextAttemptTime: optTime(r.NextAttemptAt), LeaseOwner: r.LeaseOwner,
			LeaseExpireTime: optTime(r.LeaseUntil), OccurTime: timestamppb.New(r.OccurredAt),
			CreateTime: timestamppb.New(r.CreatedAt), PublishTime: optTime(r.PublishedAt),
		})
	}
	if more {
		resp.NextPageToken = pagetoken.Encode(recs[len(recs)-1].Seq, filter...)
	}
	return resp, nil
}
