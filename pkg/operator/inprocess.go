package operator

import (
	"context"
	"errors"

	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// inProcessKey marks a context of a call made in the service's own process
// (NewInProcess); only this package can set it, so no remote call carries it.
type inProcessKey struct{}

// authorize lets in-process calls through and verifies the operator of the
// others, returning ctx with the operator (PrincipalFrom). An in-process
// call names its operator with LogIn; its repairs are refused without one.
func (s *Service) authorize(ctx context.Context) (context.Context, error) {
	if ctx.Value(inProcessKey{}) != nil {
		return ctx, nil
	}
	return s.guard.Verify(ctx)
}

// NewInProcess returns the operations over deps for a caller inside the
// trust boundary: the service's own command line (RunCLI), which holds
// DATABASE_URL and could change the tables directly. Its reads need no
// credential (Deps.Token is ignored); its repairs need the operator that
// ActingAs names. Everything else (ticket, dry run, audit row, partial
// failures) is what OperatorService does over gRPC.
func NewInProcess(deps Deps) (Operations, error) {
	if deps.DB == nil || deps.Logger == nil {
		return nil, errors.New("operator: NewInProcess needs a database and a logger")
	}
	// A guard that refuses every call: only the in-process marker passes.
	s, err := newService(deps, &Guard{envName: "in-process", logger: deps.Logger})
	if err != nil {
		return nil, err
	}
	return inProcess{s: s}, nil
}

type inProcess struct {
	s  *Service
	as string // the operator ActingAs names; "" refuses repairs
}

// ActingAs returns NewInProcess's operations run by principal, the operator
// the command line verified (Guard.LogIn: an operator's ID token, or
// BreakGlass for the break-glass token), recorded as the repairs' actor.
// Without it NewInProcess's repairs are refused with UNAUTHENTICATED: the
// request's actor is never the record. ops must be NewInProcess's.
func ActingAs(ops Operations, principal string) (Operations, error) {
	p, ok := ops.(inProcess)
	if !ok || principal == "" {
		return nil, errors.New("operator: ActingAs needs NewInProcess's operations and a principal")
	}
	p.as = principal
	return p, nil
}

func (p inProcess) trusted(ctx context.Context) context.Context {
	ctx = context.WithValue(ctx, inProcessKey{}, true)
	if p.as != "" {
		ctx = withPrincipal(ctx, p.as)
	}
	return ctx
}

func (p inProcess) ListOutboxEvents(ctx context.Context, req *opsv1.ListOutboxEventsRequest) (*opsv1.ListOutboxEventsResponse, error) {
	return p.s.ListOutboxEvents(p.trusted(ctx), req)
}

func (p inProcess) RequeueOutboxEvents(ctx context.Context, req *opsv1.RequeueOutboxEventsRequest) (*opsv1.RequeueOutboxEventsResponse, error) {
	return p.s.RequeueOutboxEvents(p.trusted(ctx), req)
}

func (p inProcess) ListParkedMessages(ctx context.Context, req *opsv1.ListParkedMessagesRequest) (*opsv1.ListParkedMessagesResponse, error) {
	return p.s.ListParkedMessages(p.trusted(ctx), req)
}

func (p inProcess) ReplayParkedMessage(ctx context.Context, req *opsv1.ReplayParkedMessageRequest) (*opsv1.ReplayParkedMessageResponse, error) {
	return p.s.ReplayParkedMessage(p.trusted(ctx), req)
}

func (p inProcess) ReplayDeadLetters(ctx context.Context, req *opsv1.ReplayDeadLettersRequest) (*opsv1.ReplayDeadLettersResponse, error) {
	return p.s.ReplayDeadLetters(p.trusted(ctx), req)
}

func (p inProcess) ListInboxEntries(ctx context.Context, req *opsv1.ListInboxEntriesRequest) (*opsv1.ListInboxEntriesResponse, error) {
	return p.s.ListInboxEntries(p.trusted(ctx), req)
}

func (p inProcess) GetInboxEntry(ctx context.Context, req *opsv1.GetInboxEntryRequest) (*opsv1.GetInboxEntryResponse, error) {
	return p.s.GetInboxEntry(p.trusted(ctx), req)
}

func (p inProcess) ReplayInboxEntries(ctx context.Context, req *opsv1.ReplayInboxEntriesRequest) (*opsv1.ReplayInboxEntriesResponse, error) {
	return p.s.ReplayInboxEntries(p.trusted(ctx), req)
}

func (p inProcess) CleanupInbox(ctx context.Context, req *opsv1.CleanupInboxRequest) (*opsv1.CleanupInboxResponse, error) {
	return p.s.CleanupInbox(p.trusted(ctx), req)
}

func (p inProcess) ListJobs(ctx context.Context, req *opsv1.ListJobsRequest) (*opsv1.ListJobsResponse, error) {
	return p.s.ListJobs(p.trusted(ctx), req)
}

func (p inProcess) RetryJobs(ctx context.Context, req *opsv1.RetryJobsRequest) (*opsv1.RetryJobsResponse, error) {
	return p.s.RetryJobs(p.trusted(ctx), req)
}

func (p inProcess) ListOperatorAudit(ctx context.Context, req *opsv1.ListOperatorAuditRequest) (*opsv1.ListOperatorAuditResponse, error) {
	return p.s.ListOperatorAudit(p.trusted(ctx), req)
}
