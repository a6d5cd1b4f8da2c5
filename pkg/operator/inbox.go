package operator

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lossless-dev/lossless/pkg/inbox"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// The inbox entries' RPCs, over Deps.Inbox (pkg/inbox's Ops). Request
// validation (the proto's rules) has refused a malformed request with field
// violations before a handler runs; inbox.Ops checks what the proto cannot
// (ids or a bounded time range, the retention's bounds).

// inboxAuth is the inbox's authorization: the ticket, and the verified
// operator as its actor. The request's actor is only stated: it rides in
// the returned context to the audit row (NewInboxOps), which pkg/inbox's
// record has no field for.
func inboxAuth(ctx context.Context, a *opsv1.OperatorAuthorization) (context.Context, inbox.Authorization, error) {
	who, err := validateAuth(ctx, a)
	return context.WithValue(ctx, statedActorKey{}, a.GetActor()), inbox.Authorization{Ticket: a.GetTicket(), Actor: who}, err
}

type statedActorKey struct{}

// statedActor is the actor the request of ctx stated (inboxAuth), "" for none.
func statedActor(ctx context.Context) string {
	s, _ := ctx.Value(statedActorKey{}).(string)
	return s
}

// ListInboxEntries implements OperatorService.
func (s *Service) ListInboxEntries(ctx context.Context, req *opsv1.ListInboxEntriesRequest) (*opsv1.ListInboxEntriesResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	if s.deps.Inbox == nil {
		return nil, repairStatus(errNoStore("inbox"))
	}
	es, err := s.deps.Inbox.List(ctx, inbox.ListFilter{Status: inbox.Status(req.GetStatus()), Reason: req.GetReason(),
		AfterID: req.GetAfterId(), Limit: int(req.GetPageSize()), Source: s.deps.InboxSource, EventIDs: req.GetEventIds()})
	if err != nil {
		return nil, repairStatus(err)
	}
	resp := &opsv1.ListInboxEntriesResponse{}
	for i := range es {
		resp.Entries = append(resp.Entries, inboxEntry(&es[i], false))
	}
	return resp, nil
}

// GetInboxEntry implements OperatorService.
func (s *Service) GetInboxEntry(ctx context.Context, req *opsv1.GetInboxEntryRequest) (*opsv1.GetInboxEntryResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	if s.deps.Inbox == nil {
		return nil, repairStatus(errNoStore("inbox"))
	}
	e, err := s.deps.Inbox.Get(ctx, req.GetId())
	if err != nil {
		return nil, repairStatus(err)
	}
	return &opsv1.GetInboxEntryResponse{Entry: inboxEntry(&e, true)}, nil
}

// ReplayInboxEntries implements OperatorService: inbox.Ops.Replay, audited
// (action inbox.replay) in its transaction.
func (s *Service) ReplayInboxEntries(ctx context.Context, req *opsv1.ReplayInboxEntriesRequest) (*opsv1.ReplayInboxEntriesResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	if s.deps.Inbox == nil {
		return nil, repairStatus(errNoStore("inbox"))
	}
	ctx, auth, err := inboxAuth(ctx, req.GetAuthorization())
	if err != nil {
		return nil, repairStatus(err)
	}
	r := inbox.ReplayRequest{Authorization: auth, IDs: req.GetIds(), Reason: req.GetReason(), DryRun: req.GetDryRun()}
	if req.GetFromTime() != nil {
		r.From = req.GetFromTime().AsTime()
	}
	if req.GetToTime() != nil {
		r.To = req.GetToTime().AsTime()
	}
	res, err := s.deps.Inbox.Replay(ctx, r)
	if err != nil {
		return nil, repairStatus(err)
	}
	return &opsv1.ReplayInboxEntriesResponse{Ids: res.IDs, DryRun: res.DryRun}, nil
}

// CleanupInbox implements OperatorService: inbox.Ops.Cleanup, audited
// (action inbox.cleanup) after its batches.
func (s *Service) CleanupInbox(ctx context.Context, req *opsv1.CleanupInboxRequest) (*opsv1.CleanupInboxResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	if s.deps.Inbox == nil {
		return nil, repairStatus(errNoStore("inbox"))
	}
	retention, err := inbox.RetentionFromHours(int64(req.GetRetentionHours()))
	if err != nil {
		return nil, repairStatus(err)
	}
	ctx, auth, err := inboxAuth(ctx, req.GetAuthorization())
	if err != nil {
		return nil, repairStatus(err)
	}
	n, err := s.deps.Inbox.Cleanup(ctx, inbox.CleanupRequest{Authorization: auth,
		Retention: retention, DryRun: req.GetDryRun()})
	if err != nil {
		return nil, repairStatus(err)
	}
	return &opsv1.CleanupInboxResponse{Deleted: int32(n), DryRun: req.GetDryRun()}, nil
}

func inboxEntry(e *inbox.Entry, withPayload bool) *opsv1.InboxEntry {
	p := &opsv1.InboxEntry{
		Id: e.ID, Source: e.Source, EventId: e.EventID, EventType: e.EventType, SchemaVersion: int32(e.SchemaVersion),
		CorrelationKey: e.CorrelationKey, Status: string(e.Status), ParkReason: e.ParkReason, Attempts: int32(e.Attempts),
		LastError: e.LastError, ReceivedTime: timestamppb.New(e.ReceivedAt), NextAttemptTime: timestamppb.New(e.NextAttemptAt),
		MessageId: e.MessageID, Attributes: e.Attributes, Traceparent: e.Traceparent, ProcessedTime: optTime(e.ProcessedAt),
	}
	if withPayload {
		p.Payload = e.Payload
	}
	return p
}
