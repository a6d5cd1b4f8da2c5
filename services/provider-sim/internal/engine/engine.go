// Package engine is the provider simulator's execution engine: it accepts
// work orders idempotently into its own PostgreSQL store, executes them with
// a bounded pool of leased workers, and announces progress on Pub/Sub with
// stable event ids, injecting the faults drawn for each job.
//
// Every message is recorded in job_events before it is published and marked
// published after Pub/Sub accepted it. A crash in between leaves the row
// unpublished, and whoever next owns the job publishes it again with the same
// event_id: at-least-once with a stable identity, which is what the consumers'
// inbox is built for (F2).
//
// A process that dies holding leases (publish_then_crash, a kill) leaves its
// jobs to whoever claims them after the lease (Config.Lease). With an
// instance identity (Config.Instance, env INSTANCE_ID), the restarted process
// releases its predecessor's leases when it starts, under a new fencing
// token, and resumes those jobs at once; the dead incarnation's late writes
// match no row.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/lossless-dev/lossless/internal/orderhop"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/faults"
)

// Publisher publishes pre-encoded messages and returns once Pub/Sub accepted
// them. *pubsub.Publisher implements it.
type Publisher interface {
	PublishRaw(ctx context.Context, data []byte, attrs map[string]string, orderingKey string) (string, error)
}

// Order is a work order submitted for execution.
type Order struct {
	WorkOrderID uuid.UUID
	CustomerID  string
	Description string
	Positions   int32
}

// Acceptance is the provider's answer to a submission; a repeat returns the
// original one.
type Acceptance struct {
	JobID       uuid.UUID
	WorkOrderID uuid.UUID
	AcceptedAt  time.Time
}

// ErrConflict: a work order id was submitted again with different content.
// Same key, different request is a caller bug, reported rather than hidden.
var ErrConflict = errors.New("work order already submitted with different content")

// errCrashed: the publish_then_crash fault fired; the job is abandoned as a
// dead process would abandon it.
var errCrashed = errors.New("crashed after publishing (publish_then_crash fault)")

// Engine accepts and executes jobs.
type Engine struct {
	pool    *pgxpool.Pool // a pool, not a pgdb.DB: claim pipelines its transaction on a connection it acquires
	st      store
	pub     Publisher
	dice    *faults.Dice
	cfg     Config
	logger  *slog.Logger
	tracer  trace.Tracer
	wake    chan struct{}
	metrics metrics
}

// Option adds an optional dependency to an Engine.
type Option func(*Engine)

// WithTracerProvider traces job executions: each is a span, a new trace
// linked to the SubmitWorkOrder call that created the job, and the messages
// it publishes name it as their producer (docs/adr/0009).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(e *Engine) {
		if tp != nil {
			e.tracer = tp.Tracer("github.com/lossless-dev/lossless/services/provider-sim/internal/engine")
		}
	}
}

type metrics struct {
	accepted  metric.Int64Counter
	published metric.Int64Counter
	injected  metric.Int64Counter
	failures  metric.Int64Counter
	leaseLost metric.Int64Counter
	hops      *orderhop.Recorder
}

// New returns an engine; Run starts its workers.
func New(pool *pgxpool.Pool, pub Publisher, dice *faults.Dice, cfg Config, logger *slog.Logger, meter metric.Meter, opts ...Option) (*Engine, error) {
	switch {
	case pool == nil:
		return nil, errors.New("engine: nil pool")
	case pub == nil:
		return nil, errors.New("engine: nil publisher")
	case dice == nil:
		return nil, errors.New("engine: nil fault dice")
	case logger == nil:
		return nil, errors.New("engine: nil logger")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	cfg.setDefaults()
	if cfg.Owner == "" {
		cfg.Owner = leasequeue.NewOwner(cfg.Instance)
	}
	if cfg.Crash == nil {
		cfg.Crash = func() { os.Exit(3) }
	}
	meter = telemetry.MeterOrNoop(meter)
	m, err := newMetrics(meter)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		pool: pool, st: store{db: pool}, pub: pub, dice: dice, cfg: cfg,
		logger: logger, wake: make(chan struct{}, 1), metrics: m,
		tracer: tracenoop.NewTracerProvider().Tracer(""),
	}
	for _, o := range opts {
		o(e)
	}
	return e, nil
}

func newMetrics(meter metric.Meter) (metrics, error) {
	var m metrics
	var errs [5]error
	m.accepted, errs[0] = meter.Int64Counter("provider_sim.jobs.accepted",
		metric.WithDescription("Work orders accepted (new jobs; replays not counted)."))
	m.published, errs[1] = meter.Int64Counter("provider_sim.messages.published",
		metric.WithDescription("Messages published, by kind (STARTED, COMPLETED, POISON, UNKNOWN_ORDER); duplicates count twice."))
	m.injected, errs[2] = meter.Int64Counter("provider_sim.faults.injected",
		metric.WithDescription("Faults drawn for accepted jobs, by fault."))
	m.failures, errs[3] = meter.Int64Counter("provider_sim.publish.failures",
		metric.WithDescription("Jobs whose publish failed and that retry after a backoff."))
	m.leaseLost, errs[4] = meter.Int64Counter("provider_sim.leases.lost",
		metric.WithDescription("Jobs abandoned because another worker took over their expired lease."))
	var hopErr error
	m.hops, hopErr = orderhop.New(meter)
	return m, errors.Join(append(errs[:], hopErr)...)
}

// Submit accepts o once: a repeat (also a concurrent one) returns the original
// acceptance with created=false. With the early_completion fault, the job is
// executed and its completion published before Submit returns (F5).
func (e *Engine) Submit(ctx context.Context, o Order) (Acceptance, bool, error) {
	// Insert first and read the job back only when the insert found one: a
	// new order costs one statement, a repeat two. Every submission draws a
	// plan, a repeat too (it is thrown away), so the same sequence of
	// submissions draws the same plans (package faults); a retry shifts the
	// plans of the orders after it, as any extra submission does.
	plan := e.dice.Draw(o.Positions)
	runFor := e.runTime(o.Positions, plan)
	jobID, err := uuid.NewV7()
	if err != nil {
		return Acceptance{}, false, err
	}
	status := statusAccepted
	if plan.EarlyCompletion {
		status = statusCompleted
	}
	// A plain job is one statement; an early completion also records its
	// messages, in a transaction with the job.
	var q pgx.Row
	var tx pgx.Tx
	traceparent, tracestate := telemetry.TraceHeaders(ctx)
	args := []any{jobID, o.WorkOrderID, o.CustomerID, o.Description, o.Positions,
		status, runFor.Microseconds(), plan.EarlyCompletion, plan.Duplicate, plan.SplitFirst, string(plan.Poison),
		plan.UnknownOrder, plan.PublishThenCrash, e.cfg.Owner, e.cfg.Lease.Microseconds(), traceparent, tracestate}
	if plan.EarlyCompletion {
		ptx, err := pgdb.Begin(ctx, e.pool, e.logger)
		if err != nil {
			return Acceptance{}, false, err
		}
		tx = ptx
		defer func() { _ = ptx.Rollback(ctx) }() // after the commit: a no-op
		q = tx.QueryRow(ctx, insertJob, args...)
	} else {
		q = e.pool.QueryRow(ctx, insertJob, args...)
	}
	j, err := scanJob(q)
	if errors.Is(err, pgx.ErrNoRows) {
		// A concurrent submission of the same order won; answer with its job.
		if tx != nil {
			_ = tx.Rollback(ctx)
		}
		j, err := e.lookup(ctx, o)
		return acceptanceOf(j), false, err
	}
	if err != nil {
		return Acceptance{}, false, fmt.Errorf("insert job: %w", err)
	}
	if plan.EarlyCompletion {
		// Started and completed at once: both facts are recorded with the job.
		at := now()
		started, err := startedEvent(j, at)
		if err != nil {
			return Acceptance{}, false, err
		}
		done, err := completionEvents(j, at)
		if err != nil {
			return Acceptance{}, false, err
		}
		rows := append([]eventRow{started}, done...)
		jobIDs := make([]uuid.UUID, len(rows))
		for i := range jobIDs {
			jobIDs[i] = j.ID
		}
		if _, err := tx.Exec(ctx, insertEvents, insertEventsArgs(jobIDs, rows)...); err != nil {
			return Acceptance{}, false, fmt.Errorf("record the job's messages: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return Acceptance{}, false, fmt.Errorf("commit job: %w", err)
		}
	}
	e.recordAccepted(ctx, j, runFor)
	if plan.EarlyCompletion {
		// The fault: publish the completion now, inside the call, so it
		// overtakes the caller's own record of the hand-off. A failure here
		// is not the caller's: the job is accepted and a worker retries.
		e.execute(ctx, j)
	} else {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
	return acceptanceOf(j), true, nil
}

func (e *Engine) lookup(ctx context.Context, o Order) (*job, error) {
	j, err := scanJob(e.pool.QueryRow(ctx, selectJobByWorkOrder, o.WorkOrderID))
	if err != nil {
		return nil, err
	}
	if j.CustomerID != o.CustomerID || j.Description != o.Description || j.Positions != o.Positions {
		return j, fmt.Errorf("%w: work order %s (job %s)", ErrConflict, o.WorkOrderID, j.ID)
	}
	return j, nil
}

func acceptanceOf(j *job) Acceptance {
	if j == nil {
		return Acceptance{}
	}
	return Acceptance{JobID: j.ID, WorkOrderID: j.WorkOrderID, AcceptedAt: j.AcceptedAt}
}

func (e *Engine) recordAccepted(ctx context.Context, j *job, runFor time.Duration) {
	e.metrics.accepted.Add(ctx, 1)
	var drawn []string
	add := func(on bool, name string) {
		if on {
			drawn = append(drawn, name)
			e.metrics.injected.Add(ctx, 1, metric.WithAttributes(attribute.String("fault", name)))
		}
	}
	add(j.Plan.EarlyCompletion, "early_completion")
	add(j.Plan.Duplicate, "duplicate")
	add(j.Plan.SplitFirst > 0, "split_completion")
	add(j.Plan.Poison != faults.PoisonNone, "poison")
	add(j.Plan.UnknownOrder, "unknown_order")
	add(j.CrashPending, "publish_then_crash")
	// Per order: DEBUG, unless a fault was drawn for it (an operator of a
	// fault run wants to see which orders will misbehave, and how).
	level := slog.LevelDebug
	if len(drawn) > 0 {
		level = slog.LevelInfo
	}
	e.logger.Log(ctx, level, "job accepted", "job_id", j.ID, "work_order_id", j.WorkOrderID,
		"positions", j.Positions, "run_for", runFor, "faults", drawn, "poison_kind", string(j.Plan.Poison))
}

// runTime is base + positions x cost, scaled by the jitter, plus the extra delay.
func (e *Engine) runTime(positions int32, plan faults.Plan) time.Duration {
	d := e.cfg.ExecBase + time.Duration(positions)*e.cfg.ExecPerPosition
	d = time.Duration(float64(d) * (1 + e.cfg.ExecJitter*plan.Jitter))
	return max(d, 0) + plan.ExtraDelay
}

// Run claims and executes jobs, at most Workers at a time, until ctx is
// cancelled; then it waits for every in-flight job to finish or be released.
// One claim loop per instance feeds the workers, up to claimBatch jobs a
// claim, so an idle instance costs one claim (two round trips) per
// PollInterval, whatever its worker count, and a busy one less than one per
// job.
func (e *Engine) Run(ctx context.Context) error {
	e.logger.InfoContext(ctx, "engine started", "workers", e.cfg.Workers, "instance", e.cfg.Instance,
		"owner", e.cfg.Owner, "lease", e.cfg.Lease)
	if e.cfg.Instance != "" {
		e.releaseInstance(ctx)
	}
	var running sync.WaitGroup
	slots := make(chan struct{}, e.cfg.Workers)
	for ctx.Err() == nil {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		free := 1
	fill:
		for free < claimBatch {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break fill
			}
		}
		// The claim is not cut off by shutdown: cancelled as it commits, it
		// could commit on the server while the client sees an error, leaving
		// jobs leased by nobody until their lease expires. A job claimed as
		// the engine stops is released at once by execute.
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
		jobs, err := e.claim(cctx, free)
		ccancel()
		for range free - len(jobs) {
			<-slots
		}
		for _, j := range jobs {
			running.Go(func() {
				defer func() { <-slots }()
				e.execute(ctx, j)
			})
		}
		if len(jobs) == free {
			continue // more may be due
		}
		if err != nil && ctx.Err() == nil {
			// Database unavailable (F15): nothing is claimed, so nothing is
			// lost; try again after the poll interval.
			e.logger.WarnContext(ctx, "claim failed", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-e.wake:
		case <-time.After(e.cfg.PollInterval):
		}
	}
	running.Wait()
	e.logger.InfoContext(ctx, "engine stopped", "owner", e.cfg.Owner)
	return nil
}

// claim leases up to n due jobs to this engine and starts those that were
// waiting (ACCEPTED): their start and STARTED messages commit with the
// leases, in one transaction of two round trips (BEGIN with the claim, the
// messages with COMMIT). A claim that leased nothing ends with a rollback:
// it wrote nothing.
func (e *Engine) claim(ctx context.Context, n int) ([]*job, error) {
	var jobs []*job
	first := &pgx.Batch{}
	first.Queue(claimJobs, e.cfg.Owner, e.cfg.Lease.Microseconds(), n).Query(func(rows pgx.Rows) error {
		var err error
		jobs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (*job, error) {
			var started bool
			var at *time.Time
			j, err := scanJob(r, &started, &at)
			if err != nil || !started {
				return j, err
			}
			ev, err := startedEvent(j, at.UTC())
			j.Started = &ev
			return j, err
		})
		return err
	})
	tx, err := pgdb.Begin(ctx, e.pool, e.logger)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // after the commit: a no-op
	if err := tx.SendBatch(ctx, first).Close(); err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return nil, nil
	}
	var ids []uuid.UUID
	var rows []eventRow
	for _, j := range jobs {
		if j.Started != nil {
			ids, rows = append(ids, j.ID), append(rows, *j.Started)
		}
	}
	last := &pgx.Batch{}
	if len(rows) > 0 {
		last.Queue(insertEvents, insertEventsArgs(ids, rows)...)
	}
	if err := tx.CommitWith(ctx, last); err != nil {
		return nil, err
	}
	return jobs, nil
}

// releaseInstance gives back the jobs earlier incarnations of this instance
// still hold, before the first claim, so the claim loop takes them at once.
// Best effort: if it fails, those leases simply expire.
func (e *Engine) releaseInstance(ctx context.Context) {
	tag, err := e.pool.Exec(ctx, releaseInstance, e.cfg.Instance, e.cfg.Owner)
	switch {
	case err != nil:
		e.logger.WarnContext(ctx, "could not release the jobs of this instance's previous incarnation; they wait for their lease",
			"instance", e.cfg.Instance, "err", err)
	case tag.RowsAffected() > 0:
		e.logger.WarnContext(ctx, "released the jobs of this instance's previous incarnation", "instance", e.cfg.Instance,
			"released", tag.RowsAffected())
	}
}

// execute drives a leased job to DONE, renewing its lease meanwhile. On
// shutdown it releases the job for the next owner; on a technical failure it
// schedules a retry.
func (e *Engine) execute(ctx context.Context, j *job) {
	ctx, span := telemetry.StartLinked(ctx, e.tracer, "provider execute", j.Traceparent, j.Tracestate,
		trace.WithAttributes(attribute.String("work_order.id", j.WorkOrderID.String()), attribute.String("provider.job_id", j.ID.String())))
	defer span.End()
	log := e.logger.With("job_id", j.ID, "work_order_id", j.WorkOrderID, "lease_token", j.LeaseToken)
	jobCtx, cancel := context.WithCancelCause(ctx)
	var hb sync.WaitGroup
	hb.Go(func() { e.heartbeat(jobCtx, cancel, j) })
	out, err := e.advance(jobCtx, j, log)
	cause := context.Cause(jobCtx)
	cancel(nil)
	hb.Wait()
	bg, stop := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer stop()
	switch {
	case err == nil:
		log.DebugContext(ctx, "job done")
	case errors.Is(err, errCrashed):
		// A dead process records nothing and releases nothing.
	case errors.Is(err, errLeaseLost) || errors.Is(cause, errLeaseLost):
		e.metrics.leaseLost.Add(bg, 1)
		log.WarnContext(bg, "lease lost; another worker owns the job now", "err", err)
	case ctx.Err() != nil:
		// The release records what was published, so the next owner does
		// not publish it again.
		if rerr := e.st.step(bg, releaseJob, j, out); rerr != nil {
			e.followUpFailed(bg, log, "release on shutdown failed; the lease will expire", rerr, err)
			return
		}
		log.InfoContext(bg, "job released on shutdown", "status", j.Status)
	default:
		e.metrics.failures.Add(bg, 1)
		delay := e.cfg.Retry.Delay(j.Attempts + 1)
		if rerr := e.st.step(bg, retryJob, j, out, err.Error(), delay.Microseconds()); rerr != nil {
			e.followUpFailed(bg, log, "scheduling retry failed; the lease will expire", rerr, err)
			return
		}
		log.WarnContext(bg, "job failed; retrying", "err", err, "attempt", j.Attempts+1, "retry_in", delay)
	}
}

// followUpFailed reports a release or retry that failed. Refused by the
// fence, it is a lost lease like any other: a step's write that died with
// its connection (a partition outlasting TCP_USER_TIMEOUT) leaves the
// follow-up as the first write to meet the new owner's token.
func (e *Engine) followUpFailed(ctx context.Context, log *slog.Logger, msg string, err, cause error) {
	if errors.Is(err, errLeaseLost) {
		e.metrics.leaseLost.Add(ctx, 1)
		log.WarnContext(ctx, "lease lost; another worker owns the job now", "err", err, "cause", cause)
		return
	}
	log.WarnContext(ctx, msg, "err", err, "cause", cause)
}

func (e *Engine) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, j *job) {
	t := time.NewTicker(e.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := e.st.fenced(ctx, renewLease, j.ID, j.LeaseToken, e.cfg.Lease.Microseconds())
		if errors.Is(err, errLeaseLost) {
			cancel(errLeaseLost)
			return
		}
		if err != nil && ctx.Err() == nil {
			e.logger.WarnContext(ctx, "lease renewal failed", "job_id", j.ID, "err", err)
		}
	}
}

// advance moves the job through its remaining steps; each step is recorded
// before its messages are published, so any step can be resumed. A step's
// publishes are recorded by the next step's statement (or by finish, the
// release or the retry); advance returns those not recorded yet.
func (e *Engine) advance(ctx context.Context, j *job, log *slog.Logger) ([]published, error) {
	var out []published
	var err error
	// startedAt is known when this owner's claim started the job; a job
	// resumed after a restart does not carry it, and its execute hop goes
	// unobserved.
	var startedAt time.Time
	if started := j.Started; started != nil {
		startedAt = started.OccurredAt
		e.metrics.hops.Observe(ctx, orderhop.ProviderStart, j.AcceptedAt, startedAt)
		log.DebugContext(ctx, "execution started", "run_for", j.RunFor)
		if out, err = e.publish(ctx, j, []eventRow{*started}, nil, log); err != nil {
			return out, err
		}
	} else {
		// Resumed (after a restart, a lost lease, a retry) or completed
		// early: what is still unpublished is in job_events.
		rows, err := e.st.unpublished(ctx, j.ID)
		if err != nil {
			return nil, fmt.Errorf("read unpublished events: %w", err)
		}
		if out, err = e.publish(ctx, j, rows, out, log); err != nil {
			return out, err
		}
	}
	if j.Status == statusExecuting {
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(j.Remaining):
		}
		completedAt := now()
		done, err := completionEvents(j, completedAt)
		if err != nil {
			return out, err
		}
		if err := e.st.record(ctx, recordCompleted, j, out, done); err != nil {
			return out, fmt.Errorf("complete: %w", err)
		}
		e.metrics.hops.Observe(ctx, orderhop.ProviderExecute, startedAt, completedAt)
		j.Status = statusCompleted
		if out, err = e.publish(ctx, j, done, nil, log); err != nil {
			return out, err
		}
	}
	if err = e.st.step(ctx, finishJob, j, out); err != nil {
		return out, err
	}
	return nil, nil
}

// publish publishes rows in order and returns out with each publish
// appended, to be recorded by the job's next write.
func (e *Engine) publish(ctx context.Context, j *job, rows []eventRow, out []published, log *slog.Logger) ([]published, error) {
	for _, r := range rows {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if err := e.publishOne(ctx, j, r, log); err != nil {
			return out, err
		}
		out = append(out, published{EventID: r.EventID, At: now()})
	}
	return out, nil
}

// claimTimeout bounds one claim's transaction, which shutdown does not
// cancel.
const claimTimeout = 5 * time.Second

// claimBatch caps the jobs one claim leases (and the free workers
// it waits for none of: it takes what is free, at least one).
const claimBatch = 16

// publishGrace is how long a publish in progress may go on after its job's
// context ended (shutdown, lost lease).
const publishGrace = 5 * time.Second

// publishOne publishes one recorded message (its copies); the job's next
// write records the publish. A shutdown lets it finish for up to
// publishGrace, so the release records it: stopping between "published" and
// "recorded" would only cause a needless duplicate.
func (e *Engine) publishOne(parent context.Context, j *job, r eventRow, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	defer cancel()
	stop := context.AfterFunc(parent, func() { time.AfterFunc(publishGrace, cancel) })
	defer stop()
	crash := j.CrashPending && r.Kind == kindCompleted
	if crash {
		if err := e.st.fenced(ctx, disarmCrash, j.ID, j.LeaseToken); err != nil {
			return err
		}
		j.CrashPending = false
	}
	attrs := pubsub.EventAttributes(r.EventID.String(), r.EventType, 1, r.OccurredAt)
	if tp, ts := telemetry.TraceHeaders(ctx); tp != "" {
		attrs[pubsub.AttrTraceparent] = tp
		if ts != "" {
			attrs[pubsub.AttrTracestate] = ts
		}
	}
	for range r.Copies {
		if _, err := e.pub.PublishRaw(ctx, r.Payload, attrs, r.OrderingKey); err != nil {
			return fmt.Errorf("publish %s event %s: %w", r.Kind, r.EventID, err)
		}
		e.metrics.published.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", r.Kind)))
	}
	if r.Kind == kindCompleted {
		e.metrics.hops.Observe(ctx, orderhop.ProviderPublish, r.OccurredAt, time.Now())
	}
	e.logPublished(ctx, log, r)
	if crash {
		log.WarnContext(ctx, "fault publish_then_crash: crashing after the publish, before recording it",
			"event_id", r.EventID)
		e.cfg.Crash()
		return errCrashed
	}
	return nil
}

func (e *Engine) logPublished(ctx context.Context, log *slog.Logger, r eventRow) {
	args := []any{"event_id", r.EventID, "kind", r.Kind, "event_type", r.EventType, "ordering_key", r.OrderingKey}
	switch {
	case r.Kind == kindPoison:
		log.InfoContext(ctx, "fault poison: published a poison message", args...)
	case r.Kind == kindUnknownOrder:
		log.InfoContext(ctx, "fault unknown_order: published a completion for a work order that does not exist", args...)
	case r.Copies > 1:
		log.InfoContext(ctx, "fault duplicate: published the message twice with one event_id", args...)
	default:
		log.DebugContext(ctx, "message published", args...)
	}
}

// now is the business time of an event, truncated to PostgreSQL's precision
// so the stored occurred_at equals the payload's timestamp.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
