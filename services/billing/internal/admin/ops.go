package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// Ops are billing's own repairs, of its invoice jobs (RetryJobs), run from
// the CLI (RunCLI, `billing jobs retry`) and the admin service. The
// outbox, the intake's parked messages and dead letters and the audit log
// are the one operator API's (OperatorDeps). Every run needs a ticket and
// an actor and writes an operator_audit row.
type Ops struct {
	db     pgdb.DB // the workers' pool, so operator reads work while the API is flooded
	queue  *leasequeue.Queue
	logger *slog.Logger
}

// NewOps returns the operations over db and the invoice job queue.
func NewOps(db pgdb.DB, queue *leasequeue.Queue, logger *slog.Logger) (*Ops, error) {
	if db == nil || queue == nil || logger == nil {
		return nil, errors.New("admin: NewOps needs a database, the invoice queue and a logger")
	}
	return &Ops{db: db, queue: queue, logger: logger}, nil
}

// MaxRetryJobs bounds the jobs of one RetryJobs call.
const MaxRetryJobs = 1000

// RetryJobsRequest names dead invoice jobs to requeue.
type RetryJobsRequest struct {
	Authorization
	// IDs of the jobs (1..MaxRetryJobs); only dead ones are touched.
	IDs []int64
	// DryRun reports which of IDs are dead now and would be requeued;
	// nothing changes but the audit row.
	DryRun bool
}

// RetryJobs requeues the dead jobs among IDs through the queue's own
// operator path (leasequeue.Queue.Retry, as `billing jobs retry`: a fresh
// attempt budget, a leasequeue_job_audit row per job), then audits the run
// in operator_audit (action jobs.retry), a dry run too. Retry commits its
// own transaction, so the audit row is a separate one right after it.
func (o *Ops) RetryJobs(ctx context.Context, req RetryJobsRequest) ([]int64, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if len(req.IDs) == 0 || len(req.IDs) > MaxRetryJobs {
		return nil, fmt.Errorf("%w: 1..%d job ids, got %d", ErrInvalidRequest, MaxRetryJobs, len(req.IDs))
	}
	var ids []int64
	var err error
	if req.DryRun {
		ids, err = o.queue.RetryDryRun(ctx, o.db, req.IDs)
	} else {
		ids, err = o.queue.Retry(ctx, req.IDs, req.Ticket, req.Actor)
	}
	if err != nil {
		return nil, err
	}
	err = pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "jobs.retry", Actor: req.Actor, Ticket: req.Ticket,
			DryRun: req.DryRun, Params: map[string]any{"requested": req.IDs, "requeued": ids}, Affected: len(ids)})
	})
	return ids, err
}
