package operator

import (
	"context"

	opsv1 "github.com/lossless-dev/lossless/gen/lossless/ops/v1"
)

// inProcessKey marks a context of a call made in the service's own process
// (InProcess); only this package can set it, so no remote call carries it.
type inProcessKey struct{}

// authorize lets in-process calls through and checks the operator token of
// the others.
func (s *Service) authorize(ctx context.Context) error {
	if ctx.Value(inProcessKey{}) != nil {
		return nil
	}
	return s.guard.Authorize(ctx)
}

// InProcess returns the service for callers inside the trust boundary: the
// service's own command line (RunCLI), which holds DATABASE_URL and could
// change the tables directly. Its calls skip the operator token (the
// network's credential, which that caller does not need); everything else
// (ticket and actor, dry run, audit row) is the same as over gRPC.
func (s *Service) InProcess() Operations { return inProcess{s} }

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

func (p inProcess) ListOperatorAudit(ctx context.Context, req *opsv1.ListOperatorAuditRequest) (*opsv1.ListOperatorAuditResponse, error) {
	return p.s.ListOperatorAudit(trusted(ctx), req)
}
