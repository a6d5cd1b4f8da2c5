// Package api adapts the provider simulator's gRPC services
// (lossless.provider.v1) to the engine, the fault dice and, for the
// operator's job reads, the engine's tables: converters at the boundary,
// errors mapped to gRPC status codes with details.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/faults"
)

// Submitter is the engine's intake.
type Submitter interface {
	Submit(ctx context.Context, o engine.Order) (engine.Acceptance, bool, error)
}

// Answers draws how each SubmitWorkOrder call answers (the
// accept_latency_* and accept_timeout knobs). *faults.Dice implements it.
type Answers interface {
	DrawAnswer() faults.Answer
}

// Provider implements ProviderService.
type Provider struct {
	providerv1.UnimplementedProviderServiceServer
	engine  Submitter
	answers Answers
	logger  *slog.Logger
	sleep   func(ctx context.Context, d time.Duration) error
}

// Option changes an optional part of a Provider.
type Option func(*Provider)

// WithSleep replaces the wait of a drawn answer delay (tests observe the
// drawn delay instead of waiting it out). sleep returns early, with the
// context's error, when ctx ends.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(p *Provider) { p.sleep = sleep }
}

// NewProvider returns the intake service.
func NewProvider(e Submitter, answers Answers, logger *slog.Logger, opts ...Option) (*Provider, error) {
	if e == nil || answers == nil || logger == nil {
		return nil, errors.New("api: NewProvider: nil engine, answers or logger")
	}
	p := &Provider{engine: e, answers: answers, logger: logger, sleep: sleep}
	for _, o := range opts {
		o(p)
	}
	if p.sleep == nil {
		return nil, errors.New("api: NewProvider: nil sleep")
	}
	return p, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// SubmitWorkOrder accepts a work order; a repeat returns the original
// acceptance with created=false. Requests are validated by the server's
// protovalidate interceptor before they get here.
//
// The answer comes after the delay drawn for the call, or never (until the
// caller's deadline or cancellation) when the call draws a timeout. Both
// apply after the job is recorded: like a real provider whose answer is late
// or lost, it has accepted the work, and the caller's retry finds it.
func (p *Provider) SubmitWorkOrder(ctx context.Context, req *providerv1.SubmitWorkOrderRequest) (*providerv1.SubmitWorkOrderResponse, error) {
	id, err := uuid.Parse(req.GetWorkOrderId())
	if err != nil {
		return nil, apierror.InvalidArgument(apierror.Violation{Field: "work_order_id", Description: "must be a UUID"})
	}
	answer := p.answers.DrawAnswer()
	resp, err := p.submit(ctx, id, req)
	if err != nil {
		return nil, err
	}
	if answer.Timeout {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if answer.Delay > 0 {
		if err := p.sleep(ctx, answer.Delay); err != nil {
			return nil, status.FromContextError(err).Err()
		}
	}
	return resp, nil
}

func (p *Provider) submit(ctx context.Context, id uuid.UUID, req *providerv1.SubmitWorkOrderRequest) (*providerv1.SubmitWorkOrderResponse, error) {
	acc, created, err := p.engine.Submit(ctx, engine.Order{
		WorkOrderID: id,
		CustomerID:  req.GetCustomerId(),
		Description: req.GetDescription(),
		Positions:   req.GetPositions(),
	})
	switch {
	case errors.Is(err, engine.ErrConflict):
		return nil, apierror.FailedPrecondition(apierror.ReasonIdempotencyKeyMismatch, err.Error())
	case errors.Is(err, pgx.ErrNoRows):
		// Cannot happen (the row was inserted or found); never hide it.
		return nil, status.Error(codes.Internal, "accepted job not found")
	case pgdb.IsData(err):
		// The store rejected the order's values; the same values fail the
		// same way, so the caller must park the order, not retry it.
		p.logger.ErrorContext(ctx, "submit rejected by the store", "work_order_id", id, "err", err)
		return nil, apierror.InvalidArgument(apierror.Violation{Field: "work_order", Description: "rejected by the provider's store"})
	case err != nil:
		// pkg/server's interceptor answers UNAVAILABLE for an unreachable
		// store (the caller's outbox retries, F15) and INTERNAL otherwise.
		return nil, fmt.Errorf("submit work order %s: %w", id, err)
	}
	return &providerv1.SubmitWorkOrderResponse{
		Acceptance: &providerv1.Acceptance{
			JobId:       acc.JobID.String(),
			WorkOrderId: acc.WorkOrderID.String(),
			AcceptTime:  timestamppb.New(acc.AcceptedAt),
		},
		Created: created,
	}, nil
}

// Admin implements ProviderAdminService over the fault dice and the jobs'
// store.
type Admin struct {
	providerv1.UnimplementedProviderAdminServiceServer
	db     pgdb.Executor
	dice   *faults.Dice
	logger *slog.Logger
	// update serialises UpdateFaults: each audit row's "before" is the
	// knobs the change replaced, and rows follow the order of the changes.
	update sync.Mutex
}

// NewAdmin returns the admin service; db is the engine's store: the jobs
// are read from it, and the fault changes recorded in its operator_audit
// (operator.WriteAudit).
func NewAdmin(db pgdb.Executor, d *faults.Dice, logger *slog.Logger) (*Admin, error) {
	if db == nil || d == nil || logger == nil {
		return nil, errors.New("api: NewAdmin: nil database, dice or logger")
	}
	return &Admin{db: db, dice: d, logger: logger}, nil
}

// ActionUpdateFaults is the operator_audit action of a change of the knobs.
const ActionUpdateFaults = "faults.update"

// Response metadata naming the fault stream in force (faults.Stream): the
// knobs' seed alone does not say which plans a start draws. Over REST they
// arrive as the headers Grpc-Metadata-Provider-Instance and
// Grpc-Metadata-Provider-Incarnation.
const (
	MetadataInstance    = "provider-instance"
	MetadataIncarnation = "provider-incarnation"
)

// GetFaults returns the knobs in force, with the effective seed, and names
// the stream in the response metadata.
func (a *Admin) GetFaults(ctx context.Context, _ *providerv1.GetFaultsRequest) (*providerv1.GetFaultsResponse, error) {
	a.sendStream(ctx)
	return &providerv1.GetFaultsResponse{Faults: toProto(a.dice.Rates())}, nil
}

func (a *Admin) sendStream(ctx context.Context) {
	s := a.dice.Stream()
	// Fails only outside a gRPC call (a direct call in a test): nothing to tell.
	_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataInstance, s.Instance,
		MetadataIncarnation, strconv.FormatInt(s.Incarnation, 10)))
}

// UpdateFaults replaces every knob (a PUT: unset fields become 0) and
// reseeds the generator, within this start's stream. The change lives in
// memory until the next restart.
//
// The change is recorded before it is applied: the operator_audit row
// (ActionUpdateFaults; params before, after, instance, incarnation) commits
// first, and only then do the knobs change, so no job ever draws from knobs
// that are not recorded. When the row cannot be written (the database is
// down) the knobs stay as they were and the error goes to the server's
// public error mapper (UNAVAILABLE for an outage). A seed of 0 is drawn from
// the clock before the row is written, so the row holds the seed in force.
func (a *Admin) UpdateFaults(ctx context.Context, req *providerv1.UpdateFaultsRequest) (*providerv1.UpdateFaultsResponse, error) {
	r := fromProto(req.GetFaults())
	auth := req.GetAuthorization()
	// The interceptor's protovalidate rules say the same (but for blank
	// values, which pass them); checking here too keeps the service correct
	// on a server without that interceptor.
	var out []apierror.Violation
	for _, v := range r.Violations() {
		out = append(out, apierror.Violation{Field: "faults." + v.Field, Description: v.Description})
	}
	if auth == nil {
		out = append(out, apierror.Violation{Field: "authorization", Description: "is required: the ticket and actor the change is audited under"})
	} else {
		out = append(out, operator.AuthorizationViolations("authorization.", auth.GetTicket(), auth.GetActor())...)
	}
	if len(out) > 0 {
		return nil, apierror.InvalidArgument(out...)
	}

	a.update.Lock()
	defer a.update.Unlock()
	before, after, stream := a.dice.Rates(), r.Seeded(), a.dice.Stream()
	params, err := auditParams(before, after, stream)
	if err != nil {
		return nil, err
	}
	if err := operator.WriteAudit(ctx, a.db, operator.AuditEntry{Action: ActionUpdateFaults, StatedActor: auth.GetActor(),
		Ticket: auth.GetTicket(), Params: params, Affected: 1}); err != nil {
		return nil, fmt.Errorf("record the fault change: %w", err)
	}
	if err := a.dice.Set(after); err != nil {
		// Cannot happen: after passed Violations above. The row records a
		// change that is not in force; say so rather than hide it.
		a.logger.ErrorContext(ctx, "fault change recorded but not applied", "ticket", auth.GetTicket(), "err", err)
		return nil, status.Error(codes.Internal, err.Error())
	}
	now := a.dice.Rates()
	a.logger.InfoContext(ctx, "fault knobs updated", "actor", auth.GetActor(), "ticket", auth.GetTicket(),
		"duplicate", now.Duplicate, "early_completion", now.EarlyCompletion,
		"split_completion", now.SplitCompletion, "poison", now.Poison, "unknown_order", now.UnknownOrder,
		"publish_then_crash", now.PublishThenCrash, "extra_delay", now.ExtraDelay,
		"accept_latency_p50", now.AcceptLatencyP50, "accept_latency_p99", now.AcceptLatencyP99,
		"accept_timeout", now.AcceptTimeout, "seed", now.Seed,
		"instance", stream.Instance, "incarnation", stream.Incarnation)
	a.sendStream(ctx)
	return &providerv1.UpdateFaultsResponse{Faults: toProto(now)}, nil
}

// auditParams are a change's operator_audit params: the knobs before and
// after in the API's JSON form with proto field names (int64 seeds as
// strings, exact; durations as "1.500s"), and the process whose knobs
// changed (each replica has its own).
func auditParams(before, after faults.Rates, s faults.Stream) (map[string]any, error) {
	p := map[string]any{"instance": s.Instance, "incarnation": strconv.FormatInt(s.Incarnation, 10)}
	for name, r := range map[string]faults.Rates{"before": before, "after": after} {
		b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(toProto(r))
		if err != nil {
			return nil, fmt.Errorf("audit params: %w", err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("audit params: %w", err)
		}
		p[name] = m
	}
	return p, nil
}

func toProto(r faults.Rates) *providerv1.Faults {
	return &providerv1.Faults{
		Duplicate:        r.Duplicate,
		EarlyCompletion:  r.EarlyCompletion,
		SplitCompletion:  r.SplitCompletion,
		Poison:           r.Poison,
		UnknownOrder:     r.UnknownOrder,
		PublishThenCrash: r.PublishThenCrash,
		ExtraDelay:       durationpb.New(r.ExtraDelay),
		Seed:             r.Seed,
		AcceptLatencyP50: durationpb.New(r.AcceptLatencyP50),
		AcceptLatencyP99: durationpb.New(r.AcceptLatencyP99),
		AcceptTimeout:    r.AcceptTimeout,
	}
}

func fromProto(f *providerv1.Faults) faults.Rates {
	return faults.Rates{
		Duplicate:        f.GetDuplicate(),
		EarlyCompletion:  f.GetEarlyCompletion(),
		SplitCompletion:  f.GetSplitCompletion(),
		Poison:           f.GetPoison(),
		UnknownOrder:     f.GetUnknownOrder(),
		PublishThenCrash: f.GetPublishThenCrash(),
		ExtraDelay:       f.GetExtraDelay().AsDuration(),
		Seed:             f.GetSeed(),
		AcceptLatencyP50: f.GetAcceptLatencyP50().AsDuration(),
		AcceptLatencyP99: f.GetAcceptLatencyP99().AsDuration(),
		AcceptTimeout:    f.GetAcceptTimeout(),
	}
}
