package leasequeue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Worker claims a queue's jobs and runs them with a Handler: fetch (keyset
// claim + rescue of expired leases), heartbeat, and group-committed fenced
// completion. Run any number of Workers, in any number of processes.
type Worker struct {
	q      *Queue
	h      Handler
	cfg    WorkerConfig
	logger *slog.Logger

	busy  atomic.Int64  // handlers running
	freed chan struct{} // a handler finished (cap 1)
	wake  chan struct{} // a NOTIFY arrived (cap 1)

	mu       sync.Mutex
	inflight map[claim]*inflight // claimed, not yet finalised; by claim, as a job may be re-claimed by this worker while its stale claim finalises
}

type inflight struct {
	job    Job
	cancel context.CancelFunc
	lost   bool // a heartbeat found the lease taken over
}

type outcome struct {
	job     Job
	effects Complete
	err     error
	release bool // shutdown cancelled the handler: give the job back
	lost    bool // lease lost: nothing to write
}

// NewWorker returns a worker of q running h.
func NewWorker(q *Queue, h Handler, cfg WorkerConfig) (*Worker, error) {
	if q == nil {
		return nil, errors.New("leasequeue: nil queue")
	}
	if h == nil {
		return nil, errors.New("leasequeue: nil handler")
	}
	cfg.setDefaults()
	cfg.setQueueDefaults(q.cfg)
	if err := cfg.ValidateFor(q.cfg); err != nil {
		return nil, fmt.Errorf("leasequeue: worker config: %w", err)
	}
	return &Worker{
		q:        q,
		h:        h,
		cfg:      cfg,
		logger:   q.logger.With("owner", cfg.Owner),
		freed:    make(chan struct{}, 1),
		wake:     make(chan struct{}, 1),
		inflight: make(map[claim]*inflight),
	}, nil
}

// Owner returns the name this worker claims under.
func (w *Worker) Owner() string { return w.cfg.Owner }

// Run works until ctx is cancelled, then shuts down gracefully: it stops
// claiming, lets running handlers finish for up to ShutdownGrace, cancels the
// rest and releases their jobs, commits what finished, and returns nil.
func (w *Worker) Run(ctx context.Context) error {
	bg := context.WithoutCancel(ctx)
	workCtx, cancelWork := context.WithCancel(bg)
	defer cancelWork()

	results := make(chan outcome, w.cfg.Workers)
	var completers sync.WaitGroup
	for range w.cfg.Completers {
		completers.Go(func() { w.completeLoop(bg, results) })
	}
	hbCtx, stopHeartbeat := context.WithCancel(bg)
	var heartbeat sync.WaitGroup
	heartbeat.Go(func() { w.heartbeatLoop(hbCtx) })
	if !w.cfg.DisableListen {
		heartbeat.Go(func() { w.listen(ctx) })
	}

	if w.cfg.Instance != "" {
		// Best effort: if it fails, those leases simply expire.
		released, parked, err := w.q.ReleaseInstance(ctx, w.cfg.Instance, w.cfg.Owner)
		switch {
		case err != nil:
			w.logger.Warn("could not release the jobs of this instance's previous incarnation; they wait for their lease", "error", err)
		case released+parked > 0:
			w.logger.Warn("released the jobs of this instance's previous incarnation", "instance", w.cfg.Instance,
				"released", released, "parked", parked)
		}
	}
	w.logger.Info("lease worker started", "workers", w.cfg.Workers, "lease", w.q.cfg.LeaseDuration)
	var handlers sync.WaitGroup
	w.fetchLoop(ctx, workCtx, results, &handlers)

	idle := make(chan struct{})
	go func() { handlers.Wait(); close(idle) }()
	grace := time.NewTimer(w.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-idle:
	case <-grace.C:
		w.logger.Warn("shutdown grace over: cancelling running handlers; their jobs are released",
			"running", w.busy.Load())
		cancelWork()
		<-idle
	}
	close(results)
	completers.Wait()
	stopHeartbeat()
	heartbeat.Wait()
	w.logger.Info("lease worker stopped")
	return nil
}

func (w *Worker) fetchLoop(ctx, workCtx context.Context, results chan<- outcome, handlers *sync.WaitGroup) {
	var cursor int64
	var lastRescue, lastFullScan time.Time
	poll := time.NewTimer(0)
	<-poll.C
	defer poll.Stop()
	wait := func(d time.Duration) {
		poll.Reset(d)
		defer poll.Stop()
		select {
		case <-ctx.Done():
		case <-w.wake:
		case <-poll.C:
		}
	}
	for ctx.Err() == nil {
		free := w.cfg.Workers - int(w.busy.Load())
		if free <= 0 {
			select {
			case <-ctx.Done():
			case <-w.freed:
			}
			continue
		}
		want := min(free, w.cfg.FetchBatch)
		var jobs []Job
		now := time.Now()
		if now.Sub(lastRescue) >= w.cfg.RescueInterval {
			lastRescue = now
			rescued, err := w.claimWith(ctx, func(c context.Context) ([]Job, error) {
				return w.q.ClaimExpired(c, w.cfg.Owner, want)
			})
			if err != nil {
				w.logger.Error("rescue of expired leases failed", "error", err)
			}
			jobs = rescued
		}
		short := false
		if n := want - len(jobs); n > 0 {
			if cursor > 0 && now.Sub(lastFullScan) >= w.cfg.FullScanInterval {
				cursor = 0
			}
			if cursor == 0 {
				lastFullScan = now
			}
			from := cursor
			fresh, err := w.claimWith(ctx, func(c context.Context) ([]Job, error) {
				return w.q.Claim(c, w.cfg.Owner, n, from)
			})
			if err != nil {
				w.logger.Error("claim failed; backing off", "error", err)
				wait(w.cfg.PollInterval)
				continue
			}
			for _, j := range fresh {
				cursor = max(cursor, j.ID)
			}
			if len(fresh) < n {
				// The end of the keyset: rewind, so the next claim also sees
				// rows committed behind the cursor and retries now due.
				short, cursor = from == 0, 0
			}
			jobs = append(jobs, fresh...)
		}
		for _, j := range jobs {
			w.start(workCtx, j, results, handlers)
		}
		if short {
			// Nothing more to claim: sleep until notified or the next poll.
			wait(w.cfg.PollInterval)
		}
	}
}

// claimWith runs a claim statement on a context that survives ctx: a claim
// cancelled mid-flight could commit without its rows reaching us, leaving
// them to wait for their lease to expire.
func (w *Worker) claimWith(ctx context.Context, f func(context.Context) ([]Job, error)) ([]Job, error) {
	if ctx.Err() != nil {
		return nil, nil
	}
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.q.cfg.LeaseDuration)
	defer cancel()
	return f(c)
}

func (w *Worker) start(workCtx context.Context, job Job, results chan<- outcome, handlers *sync.WaitGroup) {
	jctx, cancel := context.WithCancel(workCtx)
	w.mu.Lock()
	w.inflight[claimOf(job)] = &inflight{job: job, cancel: cancel}
	w.mu.Unlock()
	w.busy.Add(1)
	handlers.Go(func() {
		defer cancel()
		// One span per attempt: a new trace linked to the enqueuer's span
		// (docs/adr/0009). It covers the handler's work; the effects commit
		// later in a group commit shared with other jobs.
		jctx, span := telemetry.StartLinked(jctx, w.q.tracer, "job "+w.q.cfg.Name, job.Traceparent, job.Tracestate,
			trace.WithAttributes(attribute.Int64("job.id", job.ID), attribute.String("job.unique_key", job.UniqueKey),
				attribute.Int("job.attempt", job.Attempt), attribute.Int64("job.epoch", job.Epoch)))
		effects, err := w.call(jctx, job)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "attempt failed")
		}
		span.End()
		o := outcome{job: job, effects: effects, err: err}
		if err != nil && jctx.Err() != nil {
			w.mu.Lock()
			lost := w.inflight[claimOf(job)].lost
			w.mu.Unlock()
			o.lost = lost
			o.release = !lost && workCtx.Err() != nil
		}
		w.busy.Add(-1)
		select {
		case w.freed <- struct{}{}:
		default:
		}
		results <- o
	})
}

// call runs the handler, turning a panic into a failed attempt.
func (w *Worker) call(ctx context.Context, job Job) (effects Complete, err error) {
	defer func() {
		if p := recover(); p != nil {
			effects, err = nil, fmt.Errorf("handler panic: %v", p)
		}
	}()
	return w.h(ctx, job)
}

func (w *Worker) completeLoop(ctx context.Context, results <-chan outcome) {
	for o := range results {
		batch := []outcome{o}
	gather:
		for len(batch) < w.cfg.CompleteBatch {
			select {
			case more, ok := <-results:
				if !ok {
					break gather
				}
				batch = append(batch, more)
			default:
				break gather
			}
		}
		w.finalise(ctx, batch)
	}
}

// finalise writes the outcomes of a batch: completions in one group-committed
// transaction, failures in one statement, releases in another.
func (w *Worker) finalise(ctx context.Context, batch []outcome) {
	ctx, cancel := context.WithTimeout(ctx, w.q.cfg.LeaseDuration)
	defer cancel()
	var done []completion
	var failed []failure
	var released []Job
	for _, o := range batch {
		switch {
		case o.lost:
		case o.release:
			released = append(released, o.job)
		case o.err != nil:
			failed = append(failed, failure{job: o.job, cause: o.err})
		default:
			done = append(done, completion{job: o.job, effects: o.effects})
		}
	}
	if len(done) > 0 {
		w.q.completeBatch(ctx, done)
	}
	if len(failed) > 0 {
		res, err := w.q.fail(ctx, w.q.pool, failed)
		if err == nil {
			w.q.countFailures(ctx, res)
		} else {
			w.logger.Error("recording failed attempts failed; the jobs are left to their leases", "jobs", len(failed), "error", err)
		}
	}
	if len(released) > 0 {
		if n, err := w.q.Release(ctx, released); err != nil {
			w.logger.Error("release failed; the jobs are left to their leases", "jobs", len(released), "error", err)
		} else {
			w.logger.Info("released jobs on shutdown", "jobs", n)
		}
	}
	w.mu.Lock()
	for _, o := range batch {
		delete(w.inflight, claimOf(o.job))
	}
	w.mu.Unlock()
}

func (w *Worker) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		jobs := make([]Job, 0, len(w.inflight))
		for _, f := range w.inflight {
			if !f.lost {
				jobs = append(jobs, f.job)
			}
		}
		w.mu.Unlock()
		if len(jobs) == 0 {
			continue
		}
		c, cancel := context.WithTimeout(ctx, w.cfg.HeartbeatInterval)
		lost, err := w.q.Heartbeat(c, jobs)
		cancel()
		if err != nil {
			w.logger.Error("heartbeat failed; leases run out unless the next one succeeds", "jobs", len(jobs), "error", err)
			continue
		}
		w.mu.Lock()
		for _, j := range lost {
			if f := w.inflight[claimOf(j)]; f != nil {
				f.lost = true
				f.cancel()
			}
		}
		w.mu.Unlock()
	}
}

// listen turns NOTIFY on the queue's channel into wake-ups of the fetch loop.
func (w *Worker) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := w.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		w.logger.Warn("LISTEN connection lost; polling until it is back", "error", err)
		t := time.NewTimer(w.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func (w *Worker) listenOnce(ctx context.Context) error {
	conn, err := w.q.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection carries a LISTEN: close it rather than return it to the pool.
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = conn.Conn().Close(cctx)
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{w.q.channel}.Sanitize()); err != nil {
		return err
	}
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return err
		}
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}
