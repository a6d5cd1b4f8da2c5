package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

// Config of the operator operations. The zero value of every field means
// its default.
type Config struct {
	// DeadLetterSubscription is the inspection subscription the dead letters
	// of billing.workorder-events are replayed from. Default
	// topology.SubWorkOrderEventsDeadLetter, the one provisioned.
	DeadLetterSubscription string
}

func (c *Config) setDefaults() {
	if c.DeadLetterSubscription == "" {
		c.DeadLetterSubscription = topology.SubWorkOrderEventsDeadLetter
	}
}

// Validate reports an unusable configuration; zero fields take their
// defaults.
func (c Config) Validate() error {
	c.setDefaults()
	if p := pgtext.Problem(c.DeadLetterSubscription); p != "" {
		return fmt.Errorf("DeadLetterSubscription %q: %s", c.DeadLetterSubscription, p)
	}
	return nil
}

// Option configures NewOps.
type Option func(*Ops)

// WithQueue gives the operations the invoice job queue, needed to list and
// retry jobs (without it RetryJobs is refused).
func WithQueue(q *leasequeue.Queue) Option { return func(o *Ops) { o.queue = q } }

// WithPubSub gives the operations a Pub/Sub client, needed only to replay
// dead letters (without it ReplayDeadLetters is refused).
func WithPubSub(c *gpubsub.Client) Option { return func(o *Ops) { o.pubsub = c } }

// Ops are billing's repairs of its intake (subscription
// billing.workorder-events), run from the CLI (RunCLI): replay the
// subscription's dead letters, and list and replay parked messages; and of
// its outbox: requeue FAILED events (outbox.go). Both intake
// replays run through the intake's own idempotent path (decoder, dedup
// marker, invoice job, or parked with the reason), so a second replay, or
// the replay of a message already consumed, has no second effect. Every run
// needs a ticket and an actor and writes an operator_audit row.
type Ops struct {
	db     pgdb.DB // the workers' pool, so operator reads work while the API is flooded
	intake *intake.Intake
	parked *parked.Store
	cfg    Config
	logger *slog.Logger
	pubsub *gpubsub.Client
	dl     *operator.DeadLetterReplayer // nil without WithPubSub
	queue  *leasequeue.Queue            // nil without WithQueue
	// The outbox's read and repair (outbox.go).
	outbox  *outbox.Inspector
	requeue *outbox.Requeuer
}

// NewOps returns the operations over db, consuming through in, whose parked
// messages are in store.
func NewOps(db pgdb.DB, in *intake.Intake, store *parked.Store, cfg Config, logger *slog.Logger, opts ...Option) (*Ops, error) {
	if db == nil || in == nil || store == nil || logger == nil {
		return nil, errors.New("admin: NewOps needs a database, the intake, the parked store and a logger")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	o := &Ops{db: db, intake: in, parked: store, cfg: cfg, logger: logger}
	for _, opt := range opts {
		opt(o)
	}
	var err error
	if o.pubsub != nil {
		if o.dl, err = operator.NewDeadLetterReplayer(o.pubsub, cfg.DeadLetterSubscription, logger); err != nil {
			return nil, err
		}
	}
	if o.outbox, err = outbox.NewInspector(db); err != nil {
		return nil, err
	}
	if o.requeue, err = outbox.NewRequeuer(); err != nil {
		return nil, err
	}
	return o, nil
}

// DeadLetterRequest selects dead letters to replay.
type DeadLetterRequest struct {
	Authorization
	// MaxMessages bounds the pull (1..operator.MaxDeadLetters, required).
	MaxMessages int
	// MessageIDs restricts the replay to these Pub/Sub message ids; the
	// others pulled are released untouched.
	MessageIDs []string
	// DryRun pulls, reports and releases; nothing is consumed or acked.
	DryRun bool
}

// DeadLetterResult reports a dead-letter replay.
type DeadLetterResult struct {
	// MessageIDs are the messages taken (in a dry run: that would be).
	MessageIDs []string
	// Outcomes counts the consumed messages by intake outcome (enqueued,
	// duplicate, order_already_queued, parked, unknown_type).
	Outcomes map[string]int
	// Failed are the messages that met an infrastructure error: released,
	// still on the inspection subscription.
	Failed []string
	DryRun bool
}

// ReplayDeadLetters pulls up to MaxMessages from the dead-letter inspection
// subscription and consumes the selected ones as one batch through the
// intake (intake.Process: one transaction, dedup marker and invoice job, or
// parked with its reason), then acks them; an infrastructure error rolls
// the batch back and releases it. The run is audited in operator_audit
// (action intake.replay-dead-letters) after the batch committed.
func (o *Ops) ReplayDeadLetters(ctx context.Context, req DeadLetterRequest) (DeadLetterResult, error) {
	if err := req.Validate(); err != nil {
		return DeadLetterResult{}, err
	}
	if o.dl == nil {
		return DeadLetterResult{}, errors.New("admin: no Pub/Sub client configured")
	}
	res := DeadLetterResult{Outcomes: map[string]int{}}
	dl, err := o.dl.Replay(ctx, operator.DeadLetterRequest{MaxMessages: req.MaxMessages, MessageIDs: req.MessageIDs, DryRun: req.DryRun},
		func(ctx context.Context, ms []*pubsub.Received) []error {
			outcomes, errs := o.intake.Process(ctx, ms)
			for i, oc := range outcomes {
				if errs[i] == nil {
					res.Outcomes[oc]++
				}
			}
			return errs
		})
	switch {
	case errors.Is(err, operator.ErrInvalidRequest):
		return DeadLetterResult{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	case err != nil:
		// One transaction: nothing of the batch committed.
		return DeadLetterResult{}, fmt.Errorf("admin: replay dead letters: %w", err)
	}
	res.MessageIDs, res.Failed, res.DryRun = dl.MessageIDs, dl.Failed, dl.DryRun
	err = pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "intake.replay-dead-letters", Actor: req.Actor, Ticket: req.Ticket,
			DryRun: req.DryRun, Affected: len(res.MessageIDs), Params: map[string]any{
				"subscription": o.cfg.DeadLetterSubscription, "message_ids": res.MessageIDs, "max_messages": req.MaxMessages,
				"outcomes": res.Outcomes,
			}})
	})
	return res, err
}

// ListParked returns a page of the open parked messages, oldest first.
func (o *Ops) ListParked(ctx context.Context, f parked.ListFilter) ([]parked.Parked, error) {
	return o.parked.List(ctx, o.db, f)
}

// ParkedReplayRequest names one parked message to replay.
type ParkedReplayRequest struct {
	Authorization
	// ID of the parked_messages row (required).
	ID int64
	// DryRun runs the replay and rolls it back: it reports the outcome the
	// message would have, or why it is still refused, and changes nothing
	// but the audit row.
	DryRun bool
}

// ReplayParked consumes an open parked message through the intake
// (intake.Replay: the row is marked replayed by the actor under the ticket
// with the effect), and audits it in operator_audit (action
// intake.replay-parked, as OperatorService does) in the same transaction. A
// message still refused changes nothing and is not audited; its error wraps
// intake.ErrStillRefused.
func (o *Ops) ReplayParked(ctx context.Context, req ParkedReplayRequest) (outcome string, err error) {
	if err := req.Validate(); err != nil {
		return "", err
	}
	if req.ID <= 0 {
		return "", fmt.Errorf("%w: a parked message id is required", ErrInvalidRequest)
	}
	err = pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error {
		err := operator.InSavepoint(ctx, tx, req.DryRun, func(sp pgx.Tx) (err error) {
			outcome, err = o.intake.Replay(ctx, sp, req.ID, req.Ticket, req.Actor)
			return err
		})
		if err != nil {
			return err
		}
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "intake.replay-parked", Actor: req.Actor, Ticket: req.Ticket,
			DryRun: req.DryRun, Params: map[string]any{"parked_id": req.ID, "outcome": outcome}, Affected: 1})
	})
	if err != nil {
		return "", err
	}
	return outcome, nil
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
	switch {
	case o.queue == nil:
		return nil, errors.New("admin: no invoice queue configured")
	case len(req.IDs) == 0 || len(req.IDs) > MaxRetryJobs:
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
