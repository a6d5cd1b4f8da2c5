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
// DATABASE_URL and could change the tables directly. Its calls need no
// operator token (the network's credential; Deps.Token is ignored);
// everything else (ticket and actor, dry run, audit row, partial failures)
// is what OperatorService does over gRPC.
func NewInProcess(deps Deps) (Operations, error) {
	if deps.DB == nil || deps.Logger == nil {
		return nil, errors.New("operator: NewInProcess needs a database and a logger")
	}
	// A guard that refuses every call: only the in-process marker passes.
	s, err := newService(deps, &Guard{envName: "in-process", logger: deps.Logger})
	if err != nil {
		return nil, err
	}
	return inProcess{s}, nil
}

type inProcess struct{ s *Service }

func trusted(ctx context.Context) context.Context {
	return context.WithValue(ctx, inProcessKey{}, true)
}

func (p inProcess) ListOutboxEvents(ctx context.Context, req *opsv1.ListOutboxEventsRequest) (*opsv1.ListOutboxEventsResponse, error) {
	return p.s.ListOutboxEvents(trusted(ctx), req)
}

func (p inProcess) RequeueOutboxEvents(ctx context.Context, req *opsv1.RequeueOutboxEventsRequest) (*opsv1.RequeueOutboxEventsResponse, error) {
	return p.s.RequeueOutboxEvents(trusted(ctx), req)
}

func (p inProcess) ListParkedMessages(ctx context.Context, req *opsv1.ListParkedMessagesRequest) (*opsv1.ListParkedMessagesResponse, error) {
	return p.s.ListParkedMessages(trusted(ctx), req)
}

func (p inProcess) ReplayParkedMessage(ctx context.Context, req *opsv1.ReplayParkedMessageRequest) (*opsv1.ReplayParkedMessageResponse, error) {
	return p.s.ReplayParkedMessage(trusted(ctx), req)
}

func (p inProcess) ReplayDeadLetters(ctx context.Context, req *opsv1.ReplayDeadLettersRequest) (*opsv1.ReplayDeadLettersResponse, error) {
	return p.s.ReplayDeadLetters(trusted(ctx), req)
}

func (p inProcess) ListInboxEntries(ctx context.Context, req *opsv1.ListInboxEntriesRequest) (*opsv1.ListInboxEntriesResponse, error) {
	return p.s.ListInboxEntries(trusted(ctx), req)
}

func (p inProcess) GetInboxEntry(ctx context.Context, req *opsv1.GetInboxEntryRequest) (*opsv1.GetInboxEntryResponse, error) {
	return p.s.GetInboxEntry(trusted(ctx), req)
}

func (p inProcess) ReplayInboxEntries(ctx context.Context, req *opsv1.ReplayInboxEntriesRequest) (*opsv1.ReplayInboxEntriesResponse, error) {
	return p.s.ReplayInboxEntries(trusted(ctx), req)
}

func (p inProcess) CleanupInbox(ctx context.Context, req *opsv1.CleanupInboxRequest) (*opsv1.CleanupInboxResponse, error) {
	return p.s.CleanupInbox(trusted(ctx), req)
}

func (p inProcess) ListJobs(ctx context.Context, req *opsv1.ListJobsRequest) (*opsv1.ListJobsResponse, error) {
	return p.s.ListJobs(trusted(ctx), req)
}

func (p inProcess) RetryJobs(ctx context.Context, req *opsv1.RetryJobsRequest) (*opsv1.RetryJobsResponse, error) {
	return p.s.RetryJobs(trusted(ctx), req)
}

func (p inProcess) ListOperatorAudit(ctx context.Context, req *opsv1.ListOperatorAuditRequest) (*opsv1.ListOperatorAuditResponse, error) {
	return p.s.ListOperatorAudit(trusted(ctx), req)
}
