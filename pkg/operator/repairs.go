package operator

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// The repair interface: each kind of stuck work a pattern package keeps
// offers an operator a list, a replay (its normal path again, bounded and
// idempotent) and, where resolved work piles up, a cleanup. The pattern
// packages implement it beside their own schema without importing this
// package; Service adapts each to its RPCs and adds what every repair
// shares: the token, ticket and actor, the dry run and the operator_audit
// row.

// ParkedMessages are the messages a service's consumers parked: a
// *parked.Store. A parked message is replayed by its consumer (Consumer's
// Replay), which alone can apply it.
type ParkedMessages interface {
	List(ctx context.Context, db pgdb.Executor, f parked.ListFilter) ([]parked.Parked, error)
}

// InboxEntries are a service's inbox entries: an *inbox.Ops built by
// NewInboxOps, so that its replays and cleanups are audited in
// operator_audit.
type InboxEntries interface {
	List(ctx context.Context, f inbox.ListFilter) ([]inbox.Entry, error)
	Get(ctx context.Context, id int64) (inbox.Entry, error)
	Replay(ctx context.Context, req inbox.ReplayRequest) (inbox.ReplayResult, error)
	Cleanup(ctx context.Context, req inbox.CleanupRequest) (int, error)
}

// DeadJobs are the jobs of a service's lease queue: a *leasequeue.Queue.
// Retry requeues dead ones in its own transaction (a leasequeue_job_audit
// row per job); RetryDryRun reports which it would.
type DeadJobs interface {
	List(ctx context.Context, db pgdb.Executor, f leasequeue.ListFilter) ([]leasequeue.JobInfo, error)
	Retry(ctx context.Context, ids []int64, ticket, actor string) ([]int64, error)
	RetryDryRun(ctx context.Context, db pgdb.Executor, ids []int64) ([]int64, error)
}

// Compile-time proof that the pattern packages implement the interface.
var (
	_ ParkedMessages = (*parked.Store)(nil)
	_ InboxEntries   = (*inbox.Ops)(nil)
	_ DeadJobs       = (*leasequeue.Queue)(nil)
)

// NewInboxOps returns the inbox's operator actions on db, audited in
// operator_audit (actions inbox.replay, inbox.cleanup) next to the
// service's other repairs rather than in the inbox's own inbox_audit.
func NewInboxOps(db pgdb.DB, opts ...inbox.Option) (*inbox.Ops, error) {
	audit := inbox.WithAudit(func(ctx context.Context, tx pgx.Tx, rec inbox.AuditRecord) error {
		return WriteAudit(ctx, tx, AuditEntry{Action: rec.Action, Actor: rec.Actor, StatedActor: statedActor(ctx), Ticket: rec.Ticket,
			DryRun: rec.DryRun, Params: rec.Params, Affected: rec.Affected})
	})
	return inbox.NewOps(db, append(opts, audit)...)
}

// MaxRetryJobs bounds the jobs of one RetryJobs call.
const MaxRetryJobs = 1000

// retryJobs requeues the dead jobs among ids through the queue's own
// operator path (a fresh attempt budget, a leasequeue_job_audit row per
// job), then audits the run (action jobs.retry), a dry run too. Retry
// commits its own transaction, so the audit row is a separate one right
// after it.
func (s *Service) retryJobs(ctx context.Context, a *opsv1.OperatorAuthorization, ids []int64, dryRun bool) ([]int64, error) {
	who, err := validateAuth(ctx, a)
	if err != nil {
		return nil, err
	}
	ticket := a.GetTicket()
	if len(ids) == 0 || len(ids) > MaxRetryJobs {
		return nil, fmt.Errorf("%w: 1..%d job ids, got %d", ErrInvalidRequest, MaxRetryJobs, len(ids))
	}
	var done []int64
	if dryRun {
		done, err = s.deps.Jobs.RetryDryRun(ctx, s.deps.DB, ids)
	} else {
		done, err = s.deps.Jobs.Retry(ctx, ids, ticket, who)
	}
	if err != nil {
		return nil, err
	}
	// One statement: its own transaction, no BEGIN and COMMIT around it.
	err = WriteAudit(ctx, s.deps.DB, AuditEntry{Action: "jobs.retry", StatedActor: a.GetActor(), Ticket: ticket,
		DryRun: dryRun, Params: map[string]any{"requested": ids, "requeued": done}, Affected: len(done)})
	return done, err
}

// errNoStore answers a method over a store the service does not have.
func errNoStore(what string) error {
	return fmt.Errorf("%w: this service has no %s", errUnimplemented, what)
}

var errUnimplemented = errors.New("operator: not implemented")
