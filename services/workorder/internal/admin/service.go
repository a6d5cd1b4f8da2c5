package admin

import (
	"context"
	"errors"
	"log/slog"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/services/workorder/internal/correlation"
)

// EnvOperatorToken names the environment variable holding the operator token.
const EnvOperatorToken = "WORKORDER_OPERATOR_TOKEN"

// Service implements WorkOrderAdminService. Register it with
// workorderv1.RegisterWorkOrderAdminServiceServer(srv.GRPC(), svc).
type Service struct {
	workorderv1.UnimplementedWorkOrderAdminServiceServer
	ops    *Ops
	guard  *operator.Guard
	logger *slog.Logger
}

// NewService returns the admin service. token is the operator token (from
// EnvOperatorToken); when it is empty the service refuses every call, and a
// token shorter than operator.MinTokenLength is an error.
func NewService(ops *Ops, token string, logger *slog.Logger) (*Service, error) {
	if ops == nil || logger == nil {
		return nil, errors.New("admin: NewService needs ops and a logger")
	}
	guard, err := operator.NewGuard(token, EnvOperatorToken, logger)
	if err != nil {
		return nil, err
	}
	return &Service{ops: ops, guard: guard, logger: logger}, nil
}

// AuthInterceptor refuses calls to this service without the operator token
// before anything else runs, request validation included: an unauthenticated
// caller gets UNAUTHENTICATED or PERMISSION_DENIED whatever its request, and
// nothing is read or changed. Other services on the server pass through.
func (s *Service) AuthInterceptor() grpc.UnaryServerInterceptor {
	return s.guard.ServiceInterceptor(workorderv1.WorkOrderAdminService_ServiceDesc.ServiceName)
}

// authorize checks `authorization: Bearer <token>` (operator.Guard).
func (s *Service) authorize(ctx context.Context) error { return s.guard.Authorize(ctx) }

// toStatus maps the admin operations' domain errors to gRPC codes. Anything
// else (a database outage, a bug) is returned as is, for pkg/server's
// public error mapper (apierror.Public): an outage is UNAVAILABLE with a
// retry hint, any other failure a bare INTERNAL with a reference, and the
// driver's text (SQL, hosts, user names) is logged, never sent.
func toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, inbox.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, inbox.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrOrderNotHandedOff):
		return status.Error(codes.FailedPrecondition, err.Error())
	default:
		return err
	}
}

func auth(a *workorderv1.OperatorAuthorization) inbox.Authorization {
	return inbox.Authorization{Ticket: a.GetTicket(), Actor: a.GetActor()}
}

// ListInboxEntries implements WorkOrderAdminService.
func (s *Service) ListInboxEntries(ctx context.Context, req *workorderv1.ListInboxEntriesRequest) (*workorderv1.ListInboxEntriesResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	// The event ids are the provider's: the completions' inbox source.
	es, err := s.ops.Inbox().List(ctx, inbox.ListFilter{Status: inbox.Status(req.GetStatus()), Reason: req.GetReason(),
		AfterID: req.GetAfterId(), Limit: int(req.GetPageSize()), Source: correlation.Source, EventIDs: req.GetEventIds()})
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &workorderv1.ListInboxEntriesResponse{}
	for i := range es {
		resp.Entries = append(resp.Entries, toProto(&es[i], false))
	}
	return resp, nil
}

// GetInboxEntry implements WorkOrderAdminService.
func (s *Service) GetInboxEntry(ctx context.Context, req *workorderv1.GetInboxEntryRequest) (*workorderv1.GetInboxEntryResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	e, err := s.ops.Inbox().Get(ctx, req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &workorderv1.GetInboxEntryResponse{Entry: toProto(&e, true)}, nil
}

// ReplayInboxEntries implements WorkOrderAdminService.
func (s *Service) ReplayInboxEntries(ctx context.Context, req *workorderv1.ReplayInboxEntriesRequest) (*workorderv1.ReplayInboxEntriesResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	r := inbox.ReplayRequest{Authorization: auth(req.GetAuthorization()), IDs: req.GetIds(), Reason: req.GetReason(), DryRun: req.GetDryRun()}
	if req.GetFromTime() != nil {
		r.From = req.GetFromTime().AsTime()
	}
	if req.GetToTime() != nil {
		r.To = req.GetToTime().AsTime()
	}
	res, err := s.ops.Inbox().Replay(ctx, r)
	if err != nil {
		return nil, toStatus(err)
	}
	return &workorderv1.ReplayInboxEntriesResponse{Ids: res.IDs, DryRun: res.DryRun}, nil
}

// ReplayDeadLetters implements WorkOrderAdminService.
func (s *Service) ReplayDeadLetters(ctx context.Context, req *workorderv1.ReplayDeadLettersRequest) (*workorderv1.ReplayDeadLettersResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	res, err := s.ops.ReplayDeadLetters(ctx, DeadLetterRequest{Authorization: auth(req.GetAuthorization()),
		MessageIDs: req.GetMessageIds(), MaxMessages: int(req.GetMaxMessages()), DryRun: req.GetDryRun()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &workorderv1.ReplayDeadLettersResponse{MessageIds: res.MessageIDs, Inserted: int32(res.Inserted),
		Duplicates: int32(res.Duplicates), Poison: int32(res.Poison), Conflicts: int32(res.Conflicts), DryRun: res.DryRun}, nil
}

// CleanupInbox implements WorkOrderAdminService.
func (s *Service) CleanupInbox(ctx context.Context, req *workorderv1.CleanupInboxRequest) (*workorderv1.CleanupInboxResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	retention, err := inbox.RetentionFromHours(int64(req.GetRetentionHours()))
	if err != nil {
		return nil, toStatus(err)
	}
	n, err := s.ops.Inbox().Cleanup(ctx, inbox.CleanupRequest{Authorization: auth(req.GetAuthorization()),
		Retention: retention, DryRun: req.GetDryRun()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &workorderv1.CleanupInboxResponse{Deleted: int32(n), DryRun: req.GetDryRun()}, nil
}

// RecordReHandOff implements WorkOrderAdminService.
func (s *Service) RecordReHandOff(ctx context.Context, req *workorderv1.RecordReHandOffRequest) (*workorderv1.RecordReHandOffResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	id, err := uuid.Parse(req.GetWorkOrderId())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "work_order_id must be a UUID")
	}
	wp, open, err := s.ops.RecordReHandOff(ctx, auth(req.GetAuthorization()), id)
	if err != nil {
		return nil, toStatus(err)
	}
	return &workorderv1.RecordReHandOffResponse{WaitingPointId: wp, OpenWaitingPoints: int32(open)}, nil
}

func toProto(e *inbox.Entry, withPayload bool) *workorderv1.InboxEntry {
	p := &workorderv1.InboxEntry{
		Id: e.ID, Source: e.Source, EventId: e.EventID, EventType: e.EventType, SchemaVersion: int32(e.SchemaVersion),
		CorrelationKey: e.CorrelationKey, Status: string(e.Status), ParkReason: e.ParkReason, Attempts: int32(e.Attempts),
		LastError: e.LastError, ReceivedTime: timestamppb.New(e.ReceivedAt), NextAttemptTime: timestamppb.New(e.NextAttemptAt),
		MessageId: e.MessageID, Attributes: e.Attributes, Traceparent: e.Traceparent,
	}
	if e.ProcessedAt != nil {
		p.ProcessedTime = timestamppb.New(*e.ProcessedAt)
	}
	if withPayload {
		p.Payload = e.Payload
	}
	return p
}
