package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/inbox"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// Page sizes of the listings, as the proto documents them.
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

var (
	// ErrInvalidRequest marks an operator request that is incomplete or out
	// of bounds (INVALID_ARGUMENT); nothing was changed.
	ErrInvalidRequest = errors.New("operator: invalid request")
	// ErrStillRefused marks a parked message its consumer still refuses
	// (FAILED_PRECONDITION); a Consumer's Replay wraps it.
	ErrStillRefused = errors.New("operator: still refused")
)

// Consumer is one of a service's consumers, as its operator repairs need
// it.
type Consumer struct {
	// Name selects it in a request (field consumer) and prefixes its audit
	// actions: <Name>.replay-dead-letters, <Name>.replay-parked. Required.
	Name string
	// DeadLetterSubscription is its dead-letter inspection subscription;
	// empty: it has no dead letters to replay.
	DeadLetterSubscription string
	// Process applies messages as the live consumer does: an outcome and an
	// error per message (nil error: durably handled). Required with
	// DeadLetterSubscription.
	Process func(ctx context.Context, ms []*pubsub.Received) (outcomes []string, errs []error)
	// Replay re-applies the parked message id in tx, marking its row
	// replayed by actor under ticket; a message still refused is an error
	// wrapping ErrStillRefused. Nil: it parks nothing.
	Replay func(ctx context.Context, tx pgx.Tx, id int64, ticket, actor string) (outcome string, err error)
}

// Deps are a service's own stores the operations run over.
type Deps struct {
	// DB is the service's database (required): the outbox, parked_messages
	// and operator_audit tables are there.
	DB pgdb.DB
	// Token is the break-glass operator token; shorter than MinTokenLength
	// is an error. TokenEnv names where it came from (for errors and logs;
	// required). Without it and without identities (Guard) every call is
	// refused.
	Token, TokenEnv string
	// Guard are the guard's options: the operator identities
	// (WithIdentities), the gateway mark (WithGatewayMark).
	Guard []GuardOption
	// Outbox is the service's outbox schema options (nil: the default
	// outbox).
	Outbox []outbox.Option
	// Parked is the parked-message store (nil: none): a *parked.Store.
	Parked ParkedMessages
	// Consumers whose parked messages and dead letters are replayed.
	Consumers []Consumer
	// Inbox are the service's inbox entries (nil: none), built by
	// NewInboxOps; InboxSource is their source, for listing the entries
	// of given event ids.
	Inbox       InboxEntries
	InboxSource string
	// Jobs is the service's lease queue (nil: none), whose dead jobs are
	// retried.
	Jobs DeadJobs
	// PubSub is needed to replay dead letters (nil: refused).
	PubSub *gpubsub.Client
	// Logger (required).
	Logger *slog.Logger
}

// Service implements OperatorService. Register it with
// opsv1.RegisterOperatorServiceServer and install AuthInterceptor.
type Service struct {
	opsv1.UnimplementedOperatorServiceServer
	deps    Deps
	guard   *Guard
	outbox  *outbox.Inspector
	requeue *outbox.Requeuer
	dl      map[string]*DeadLetterReplayer
}

// NewService returns the service over deps.
func NewService(deps Deps) (*Service, error) {
	if deps.DB == nil || deps.Logger == nil || deps.TokenEnv == "" {
		return nil, errors.New("operator: NewService needs a database, a logger and the token's variable name")
	}
	guard, err := NewGuard(deps.Token, deps.TokenEnv, deps.Logger, deps.Guard...)
	if err != nil {
		return nil, err
	}
	return newService(deps, guard)
}

func newService(deps Deps, guard *Guard) (*Service, error) {
	s := &Service{deps: deps, guard: guard, dl: map[string]*DeadLetterReplayer{}}
	var err error
	if s.outbox, err = outbox.NewInspector(deps.DB, deps.Outbox...); err != nil {
		return nil, err
	}
	if s.requeue, err = outbox.NewRequeuer(deps.Outbox...); err != nil {
		return nil, err
	}
	for _, c := range deps.Consumers {
		if c.Name == "" || (c.DeadLetterSubscription != "" && c.Process == nil) {
			return nil, fmt.Errorf("operator: consumer %q needs a name, and Process with a dead-letter subscription", c.Name)
		}
		if c.Replay != nil && deps.Parked == nil {
			return nil, fmt.Errorf("operator: consumer %q replays parked messages: Deps need the parked store", c.Name)
		}
		if c.DeadLetterSubscription != "" && deps.PubSub != nil {
			if s.dl[c.Name], err = NewDeadLetterReplayer(deps.PubSub, c.DeadLetterSubscription, deps.Logger); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// AuthInterceptor refuses calls to this service without an operator's
// credential before anything else runs, request validation included, and
// puts the verified operator in the context. Other services on the server
// pass through.
func (s *Service) AuthInterceptor() grpc.UnaryServerInterceptor {
	return s.guard.ServiceInterceptor(opsv1.OperatorService_ServiceDesc.ServiceName)
}

func pageSize(n int32) int {
	if n <= 0 {
		return defaultPageSize
	}
	return min(int(n), maxPageSize)
}

// repairStatus maps a repair's error: the caller's mistakes and states that
// rule the repair out are not outages; anything else passes unchanged, so
// the server's edge reports an outage as UNAVAILABLE.
func repairStatus(err error) error {
	switch {
	case errors.Is(err, ErrInvalidRequest), errors.Is(err, inbox.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, parked.ErrNotOpen), errors.Is(err, inbox.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrStillRefused):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, errUnimplemented):
		return status.Error(codes.Unimplemented, err.Error())
	case errors.Is(err, ErrNoOperator):
		return status.Error(codes.Unauthenticated, "no verified operator: repairs need an operator's ID token or the break-glass token")
	}
	return err
}

// validateAuth checks a repair's authorization and returns who acts: the
// operator verified for ctx (PrincipalFrom). The request's actor is only
// what the operator stated (AuditEntry.StatedActor).
func validateAuth(ctx context.Context, a *opsv1.OperatorAuthorization) (string, error) {
	if err := ValidateAuthorization(a.GetTicket(), a.GetActor()); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	who, ok := PrincipalFrom(ctx)
	if !ok {
		return "", ErrNoOperator
	}
	return who, nil
}

// consumer picks the named consumer among those that can (ok); an empty
// name means the only one.
func (s *Service) consumer(name string, ok func(Consumer) bool) (Consumer, error) {
	var names []string
	for _, c := range s.deps.Consumers {
		if !ok(c) {
			continue
		}
		if c.Name == name {
			return c, nil
		}
		names = append(names, c.Name)
	}
	if name == "" && len(names) == 1 {
		return s.consumer(names[0], ok)
	}
	return Consumer{}, fmt.Errorf("%w: consumer %q: choose one of %v", ErrInvalidRequest, name, names)
}

// ListOutboxEvents implements OperatorService.
func (s *Service) ListOutboxEvents(ctx context.Context, req *opsv1.ListOutboxEventsRequest) (*opsv1.ListOutboxEventsResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	// The token is bound to the set of states, whatever their order; a
	// state never contains a comma (request validation allows three names).
	states := slices.Clone(req.GetStates())
	slices.Sort(states)
	filter := []string{strings.Join(states, ","), req.GetAggregateId(), req.GetEventType()}
	after, err := DecodePageTokenID(req.GetPageToken(), filter...)
	if err != nil {
		return nil, err
	}
	f := outbox.ListFilter{AggregateID: req.GetAggregateId(), Type: req.GetEventType(), AfterSeq: after, Limit: int(req.GetPageSize())}
	for _, st := range states {
		f.States = append(f.States, outbox.State(st))
	}
	recs, more, err := s.outbox.List(ctx, f)
	if errors.Is(err, outbox.ErrInvalidFilter) {
		return nil, apierror.InvalidArgument(apierror.Violation{Field: "page_size", Description: err.Error()})
	}
	if err != nil {
		return nil, err
	}
	resp := &opsv1.ListOutboxEventsResponse{Events: make([]*opsv1.OutboxEvent, 0, len(recs))}
	for _, r := range recs {
		resp.Events = append(resp.Events, &opsv1.OutboxEvent{
			EventId: r.EventID.String(), Sequence: r.Seq, AggregateType: r.AggregateType, AggregateId: r.AggregateID,
			EventType: r.Type, SchemaVersion: int32(r.SchemaVersion), State: string(r.State), Attempts: int32(r.Attempts),
			LastError: r.LastError, NextAttemptTime: optTime(r.NextAttemptAt), LeaseOwner: r.LeaseOwner,
			LeaseExpireTime: optTime(r.LeaseUntil), OccurTime: timestamppb.New(r.OccurredAt),
			CreateTime: timestamppb.New(r.CreatedAt), PublishTime: optTime(r.PublishedAt),
		})
	}
	if more {
		resp.NextPageToken = EncodePageToken(recs[len(recs)-1].Seq, filter...)
	}
	return resp, nil
}

// RequeueOutboxEvents implements OperatorService: the FAILED events among
// event_ids go back to PENDING with a fresh attempt budget
// (outbox.Requeuer: "requeued by <actor>, ticket <ticket>; was: <error>" in
// last_error), audited (action outbox.requeue), a dry run too, in the same
// transaction.
func (s *Service) RequeueOutboxEvents(ctx context.Context, req *opsv1.RequeueOutboxEventsRequest) (*opsv1.RequeueOutboxEventsResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	res, err := s.requeueOutbox(ctx, req)
	if err != nil {
		return nil, repairStatus(err)
	}
	resp := &opsv1.RequeueOutboxEventsResponse{EventIds: requeuedIDs(res), DryRun: res.DryRun}
	for _, sk := range res.Skipped {
		resp.Skipped = append(resp.Skipped, &opsv1.SkippedOutboxEvent{EventId: sk.EventID.String(), State: string(sk.State)})
	}
	return resp, nil
}

func (s *Service) requeueOutbox(ctx context.Context, req *opsv1.RequeueOutboxEventsRequest) (res outbox.RequeueResult, err error) {
	who, err := validateAuth(ctx, req.GetAuthorization())
	if err != nil {
		return res, err
	}
	ids := make([]uuid.UUID, 0, len(req.GetEventIds()))
	for _, e := range req.GetEventIds() {
		id, err := uuid.Parse(strings.TrimSpace(e))
		if err != nil {
			return res, fmt.Errorf("%w: event id %q is not a UUID", ErrInvalidRequest, e)
		}
		ids = append(ids, id)
	}
	a := req.GetAuthorization()
	note := fmt.Sprintf("requeued by %s, ticket %s", who, strings.TrimSpace(a.GetTicket()))
	err = pgx.BeginFunc(ctx, s.deps.DB, func(tx pgx.Tx) error {
		res, err = s.requeue.Requeue(ctx, tx, outbox.RequeueRequest{EventIDs: ids, Note: note, DryRun: req.GetDryRun()})
		if err != nil {
			return err
		}
		requested := make([]string, len(ids))
		for i, id := range ids {
			requested[i] = id.String()
		}
		skipped := map[string]string{}
		for _, sk := range res.Skipped {
			skipped[sk.EventID.String()] = string(sk.State)
		}
		return WriteAudit(ctx, tx, AuditEntry{Action: "outbox.requeue", StatedActor: a.GetActor(), Ticket: a.GetTicket(),
			DryRun: req.GetDryRun(), Params: map[string]any{"requested": requested, "requeued": requeuedIDs(res), "skipped": skipped},
			Affected: len(res.Requeued)})
	})
	if errors.Is(err, outbox.ErrInvalidRequeue) {
		return outbox.RequeueResult{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return res, err
}

func requeuedIDs(res outbox.RequeueResult) []string {
	ids := make([]string, len(res.Requeued))
	for i, ev := range res.Requeued {
		ids[i] = ev.EventID.String()
	}
	return ids
}

// ListParkedMessages implements OperatorService.
func (s *Service) ListParkedMessages(ctx context.Context, req *opsv1.ListParkedMessagesRequest) (*opsv1.ListParkedMessagesResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	if s.deps.Parked == nil {
		return &opsv1.ListParkedMessagesResponse{}, nil
	}
	after, err := DecodePageTokenID(req.GetPageToken(), req.GetSubscription(), req.GetSubject())
	if err != nil {
		return nil, err
	}
	size := pageSize(req.GetPageSize())
	// One more than asked for tells whether another page follows.
	ms, err := s.deps.Parked.List(ctx, s.deps.DB, parked.ListFilter{Subscription: req.GetSubscription(), Subject: req.GetSubject(),
		AfterID: after, Limit: size + 1})
	if err != nil {
		return nil, err
	}
	resp := &opsv1.ListParkedMessagesResponse{}
	if len(ms) > size {
		ms = ms[:size]
		resp.NextPageToken = EncodePageToken(ms[size-1].ID, req.GetSubscription(), req.GetSubject())
	}
	for _, m := range ms {
		resp.Messages = append(resp.Messages, &opsv1.ParkedMessage{
			Id: m.ID, Subscription: m.Subscription, MessageId: m.MessageID, EventId: m.EventID, EventType: m.EventType,
			Subject: m.Subject, Attributes: m.Attributes, Reason: m.Reason, ParkTime: timestamppb.New(m.ParkedAt),
		})
	}
	return resp, nil
}

// ReplayParkedMessage implements OperatorService: the consumer's Replay in
// a savepoint (rolled back on a dry run) and the audit row (action
// <consumer>.replay-parked) in one transaction. A message still refused
// changes nothing and is not audited.
func (s *Service) ReplayParkedMessage(ctx context.Context, req *opsv1.ReplayParkedMessageRequest) (*opsv1.ReplayParkedMessageResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	outcome, err := s.replayParked(ctx, req)
	if err != nil {
		return nil, repairStatus(err)
	}
	return &opsv1.ReplayParkedMessageResponse{Outcome: outcome, DryRun: req.GetDryRun()}, nil
}

func (s *Service) replayParked(ctx context.Context, req *opsv1.ReplayParkedMessageRequest) (outcome string, err error) {
	who, err := validateAuth(ctx, req.GetAuthorization())
	if err != nil {
		return "", err
	}
	if req.GetId() <= 0 {
		return "", fmt.Errorf("%w: a parked message id is required", ErrInvalidRequest)
	}
	c, err := s.consumer(req.GetConsumer(), func(c Consumer) bool { return c.Replay != nil })
	if err != nil {
		return "", err
	}
	a := req.GetAuthorization()
	err = pgx.BeginFunc(ctx, s.deps.DB, func(tx pgx.Tx) error {
		err := InSavepoint(ctx, tx, req.GetDryRun(), func(sp pgx.Tx) (err error) {
			outcome, err = c.Replay(ctx, sp, req.GetId(), a.GetTicket(), who)
			return err
		})
		if err != nil {
			return err
		}
		return WriteAudit(ctx, tx, AuditEntry{Action: c.Name + ".replay-parked", StatedActor: a.GetActor(), Ticket: a.GetTicket(),
			DryRun: req.GetDryRun(), Params: map[string]any{"parked_id": req.GetId(), "outcome": outcome}, Affected: 1})
	})
	return outcome, err
}

// ReplayDeadLetters implements OperatorService: one pull of at most
// max_messages from the consumer's inspection subscription, the selected
// messages applied through its Process and acked each after its own
// commit, the rest released; audited (action <consumer>.replay-dead-letters)
// after the messages' own transactions, also when some failed: those are
// released and listed, and the others' effects are answered.
func (s *Service) ReplayDeadLetters(ctx context.Context, req *opsv1.ReplayDeadLettersRequest) (*opsv1.ReplayDeadLettersResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := validateAuth(ctx, req.GetAuthorization()); err != nil {
		return nil, repairStatus(err)
	}
	c, err := s.consumer(req.GetConsumer(), func(c Consumer) bool { return c.DeadLetterSubscription != "" })
	if err != nil {
		return nil, repairStatus(err)
	}
	dl := s.dl[c.Name]
	if dl == nil {
		return nil, errors.New("operator: no Pub/Sub client configured")
	}
	outcomes := map[string]int{}
	res, replayErr := dl.Replay(ctx, DeadLetterRequest{MaxMessages: int(req.GetMaxMessages()), MessageIDs: req.GetMessageIds(),
		DryRun: req.GetDryRun()}, func(ctx context.Context, ms []*pubsub.Received) []error {
		ocs, errs := c.Process(ctx, ms)
		for i, oc := range ocs {
			if errs[i] == nil {
				outcomes[oc]++
			}
		}
		return errs
	})
	if errors.Is(replayErr, ErrInvalidRequest) {
		return nil, repairStatus(replayErr)
	}
	if replayErr != nil && len(res.MessageIDs) == len(res.Failed) {
		return nil, fmt.Errorf("operator: replay dead letters of %s: %w", c.Name, replayErr)
	}
	a := req.GetAuthorization()
	err = pgx.BeginFunc(ctx, s.deps.DB, func(tx pgx.Tx) error {
		return WriteAudit(ctx, tx, AuditEntry{Action: c.Name + ".replay-dead-letters", StatedActor: a.GetActor(), Ticket: a.GetTicket(),
			DryRun: req.GetDryRun(), Affected: len(res.MessageIDs) - len(res.Failed), Params: map[string]any{
				"subscription": c.DeadLetterSubscription, "message_ids": res.MessageIDs, "max_messages": req.GetMaxMessages(),
				"outcomes": outcomes, "failed": res.Failed,
			}})
	})
	if err != nil {
		return nil, err
	}
	// Some messages may have failed and been released: the others' effects
	// are committed and audited, so the call answers with both.
	resp := &opsv1.ReplayDeadLettersResponse{MessageIds: res.MessageIDs, FailedMessageIds: res.Failed, DryRun: res.DryRun,
		Outcomes: map[string]int32{}}
	for k, n := range outcomes {
		resp.Outcomes[k] = int32(n)
	}
	return resp, nil
}

// ListOperatorAudit implements OperatorService.
func (s *Service) ListOperatorAudit(ctx context.Context, req *opsv1.ListOperatorAuditRequest) (*opsv1.ListOperatorAuditResponse, error) {
	ctx, err := s.authorize(ctx)
	if err != nil {
		return nil, err
	}
	filter := []string{req.GetAction(), req.GetActor(), req.GetTicket()}
	before, err := DecodePageTokenID(req.GetPageToken(), filter...)
	if err != nil {
		return nil, err
	}
	recs, more, err := ListAudit(ctx, s.deps.DB, AuditFilter{Action: req.GetAction(), Actor: req.GetActor(), Ticket: req.GetTicket(),
		BeforeID: before, Limit: pageSize(req.GetPageSize())})
	if errors.Is(err, ErrInvalidAuditFilter) {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err != nil {
		return nil, err
	}
	resp := &opsv1.ListOperatorAuditResponse{Records: make([]*opsv1.OperatorAuditRecord, 0, len(recs))}
	for _, r := range recs {
		params, err := structpb.NewStruct(r.Params)
		if err != nil {
			return nil, err
		}
		resp.Records = append(resp.Records, &opsv1.OperatorAuditRecord{Id: r.ID, Action: r.Action, Actor: r.Actor,
			Ticket: r.Ticket, DryRun: r.DryRun, Params: params, Affected: int32(r.Affected), OccurTime: timestamppb.New(r.OccurredAt)})
	}
	if more {
		resp.NextPageToken = EncodePageToken(recs[len(recs)-1].ID, filter...)
	}
	return resp, nil
}

func optTime(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}
