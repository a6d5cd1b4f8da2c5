package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgnotify"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// claimDue picks the next due entries for this relay.
//
//   - status = 'OPEN' walks the partial index inbox_open_idx, which holds only
//     live work.
//   - id > $1 is a keyset cursor: a relay draining a backlog does not re-walk
//     the dead index entries that every resolved row leaves at the front of
//     that index (the decay of the naive claim, docs/performance.md). The relay
//     resets the cursor to 0 on every SweepInterval and whenever it has caught
//     up, so nothing behind the cursor is left: entries that became due, were
//     blocked, or committed late with a lower id.
//   - NOT EXISTS is the per-key ordering guard: an entry is never
//     taken while an OLDER (lower id) entry of the same key is still OPEN,
//     whether that one is backing off or locked by another relay right now (a
//     row locked by another transaction is still OPEN in our snapshot). In
//     the worst case an entry waits one extra poll; that is the safe side.
//     One probe into inbox_open_key_idx per candidate.
//   - FOR UPDATE SKIP LOCKED lets any number of relays claim disjoint entries
//     without waiting on each other; different keys proceed in parallel.
//
// "Older" is id order. Ids are drawn at insert, in receipt order within a
// batch; across concurrent receiver transactions they may commit out of id
// order, but never for one key when the subscription uses ordering keys:
// Pub/Sub delivers the next message of a key only after the previous one is
// acked, i.e. after its insert committed. See ADR 0007.
const claimDue = `
SELECT ` + entryColumns + `
FROM {schema}.inbox i
WHERE i.status = 'OPEN'
  AND i.id > $1
  AND i.next_attempt_at <= now()
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.inbox older
      WHERE older.correlation_key = i.correlation_key
        AND older.status = 'OPEN'
        AND older.id < i.id)
ORDER BY i.id
LIMIT $2
FOR UPDATE SKIP LOCKED`

// resolveBatch writes every claimed entry's outcome in one statement.
// Times are the database's (now() + delay) so replicas with skewed clocks agree.
// i.id = ANY($1) repeats the join for the planner: a cached generic plan
// prices unnest of a parameter at 100 rows, and against a table of up to
// tens of thousands of rows it then prefers a hash join over a sequential
// scan of the whole inbox; the ANY lets it find the rows by primary key.
const resolveBatch = `
UPDATE {schema}.inbox i
SET status          = o.status,
    attempts        = o.attempts,
    next_attempt_at = now() + make_interval(secs => o.delay_ms / 1000.0),
    last_error      = coalesce(o.last_error, i.last_error),
    park_reason     = coalesce(o.park_reason, i.park_reason),
    processed_at    = CASE WHEN o.status IN ('APPLIED', 'DUPLICATE') THEN now() ELSE i.processed_at END,
    parked_at       = CASE WHEN o.status = 'PARKED' THEN now() ELSE i.parked_at END
FROM unnest($1::bigint[], $2::text[], $3::int[], $4::bigint[], $5::text[], $6::text[])
     AS o(id, status, attempts, delay_ms, last_error, park_reason)
WHERE i.id = ANY($1::bigint[]) AND i.id = o.id`

// Relay applies OPEN inbox entries through a Handler. Run any number of
// replicas: they claim disjoint entries and serialize per correlation key.
type Relay struct {
	pool    *pgxpool.Pool // a pool, not a pgdb.DB: the relay LISTENs on a connection of its own
	handler Handler
	cfg     Config
	q       queries
	logger  *slog.Logger
	tracer  trace.Tracer
	m       relayMetrics

	cursor    int64
	lastSweep time.Time
	wake      pgnotify.Wake
}

// NewRelay returns a relay applying entries with handler. It needs a pool,
// not a pgdb.DB: it holds one connection of its own for LISTEN. meter may be
// nil (no metrics). Of the options it uses WithSchema and
// WithTracerProvider.
func NewRelay(pool *pgxpool.Pool, handler Handler, cfg Config, logger *slog.Logger, meter metric.Meter, opts ...Option) (*Relay, error) {
	if pool == nil || handler == nil || logger == nil {
		return nil, errors.New("inbox: NewRelay needs a pool, a handler and a logger")
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	meter = telemetry.MeterOrNoop(meter)
	outcomes, err1 := meter.Int64Counter("inbox.relay.outcomes",
		metric.WithDescription("Inbox entries handled by the relay, by outcome (applied, duplicate, parked, deferred, technical) and park reason."))
	latency, err2 := meter.Float64Histogram("inbox.correlation.latency", metric.WithUnit("s"),
		metric.WithDescription("Time from receipt (insert) to applied."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	failures, err3 := meter.Int64Counter("inbox.relay.claim_failures",
		metric.WithDescription("Relay batches that failed as a whole (database unavailable, timeout)."))
	fallbacks, err4 := meter.Int64Counter("inbox.relay.batch_fallbacks",
		metric.WithDescription("Batches a BatchHandler could not apply as a whole, re-applied entry by entry (a technical error in the batch)."))
	panics, err5 := meter.Int64Counter("inbox.relay.handler_panics",
		metric.WithDescription("Handler panics recovered by the relay; each charges the entry being applied an attempt."))
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return nil, err
	}
	tp := o.tracer
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	return &Relay{pool: pool, handler: handler, cfg: cfg, q: newQueries(o.schema), logger: logger,
		tracer: tp.Tracer("github.com/lossless-dev/lossless/pkg/inbox"),
		m:      relayMetrics{outcomes: outcomes, latency: latency, failures: failures, fallbacks: fallbacks, panics: panics},
		wake:   pgnotify.NewWake()}, nil
}

// Run claims and applies entries until ctx is cancelled, then returns nil
// after the batch in flight is committed or rolled back. A failing batch
// (e.g. database unavailable, F15) is retried with backoff; nothing is lost
// because the entries stay OPEN.
func (r *Relay) Run(ctx context.Context) error {
	listenCtx, stopListen := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopListen()
	wg.Go(func() {
		pgnotify.Listen(listenCtx, r.pool.Config().ConnConfig, r.q.channel, r.cfg.TechnicalBackoff, r.logger,
			func(string) { r.wake.Signal() })
	})
	failures := 0
	for {
		n, err := r.ProcessBatch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var wait time.Duration
		switch {
		case err != nil:
			failures++
			r.m.failures.Add(ctx, 1)
			wait = failureWait(r.cfg, err, failures)
			r.logger.WarnContext(ctx, "inbox relay: batch failed; backing off", "error", err, "failures", failures, "wait", wait)
		case n == 0:
			failures = 0
			wait = r.cfg.PollInterval
		default:
			failures = 0
			continue
		}
		// New entries committed (NOTIFY) end an idle wait; after a failed
		// batch the backoff applies and a wake-up does not cut it short.
		wake := r.wake
		if err != nil {
			wake = nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-wake:
			t.Stop()
		case <-t.C:
		}
	}
}

// ProcessBatch claims and resolves at most one batch, returning how many
// entries it claimed. It is what Run loops over; tests and benchmarks call it.
//
// With a BatchHandler the batch is applied in one HandleBatch call, without
// savepoints. If that fails as a whole (a technical error somewhere in the
// batch), the transaction rolls back and the batch is claimed and applied
// again entry by entry, each in a savepoint (errBatchFailed): the clean path
// pays nothing for the isolation that only a failing batch needs.
func (r *Relay) ProcessBatch(ctx context.Context) (int, error) {
	if time.Since(r.lastSweep) >= r.cfg.SweepInterval {
		r.cursor, r.lastSweep = 0, time.Now()
	}
	from := r.cursor
	ctx, cancel := context.WithTimeout(ctx, r.cfg.HandlerTimeout)
	defer cancel()
	bh, batched := r.handler.(BatchHandler)
	claimed, outs, err := r.processBatch(ctx, from, bh, batched)
	if bf := (*batchFailedError)(nil); errors.As(err, &bf) && ctx.Err() == nil {
		r.m.fallbacks.Add(ctx, 1)
		r.logger.InfoContext(ctx, "inbox relay: batch failed; applying its entries one by one", "error", bf.err)
		claimed, outs, err = r.processBatch(ctx, from, nil, false)
	}
	if lost := (*lostPanicError)(nil); errors.As(err, &lost) {
		// The panic left the transaction unusable, so the batch rolled back
		// and its attempt was not recorded: record it now, or the entry would
		// take its batch down on every claim.
		if cerr := r.chargeLostPanic(ctx, lost); cerr != nil {
			return 0, errors.Join(err, cerr)
		}
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	switch {
	case len(claimed) == r.cfg.BatchSize:
		r.cursor = claimed[len(claimed)-1].ID
	case from != 0:
		// Caught up from a cursor: next claim goes back to the start, at once.
		r.cursor = 0
		if len(claimed) == 0 {
			return r.ProcessBatch(ctx)
		}
	}
	r.record(ctx, claimed, outs)
	return len(claimed), nil
}

// processBatch is one claiming transaction: claim, apply (whole batch through
// bh when batched, else entry by entry in savepoints), resolve, commit,
// pipelined (a pgdb.Tx, ADR 0023): the claim travels with the BEGIN, the
// resolve with the COMMIT and the notifications the handlers' writes
// announced (pgnotify.Notify, e.g. by outbox.Append), which go out after the
// commit. A claim that finds nothing rolls back: it locked nothing.
func (r *Relay) processBatch(ctx context.Context, from int64, bh BatchHandler, batched bool) ([]Entry, []outcome, error) {
	var claimed []Entry
	first := &pgx.Batch{}
	first.Queue(r.q.claimDue, from, r.cfg.BatchSize).Query(func(rows pgx.Rows) error {
		var err error
		claimed, err = scanEntries(rows)
		return err
	})
	tx, err := pgdb.Begin(ctx, r.pool, r.logger)
	if err != nil {
		return nil, nil, fmt.Errorf("inbox: claim: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op once committed
	if err := tx.SendBatch(ctx, first).Close(); err != nil {
		return nil, nil, fmt.Errorf("inbox: claim: %w", err)
	}
	if len(claimed) == 0 {
		return nil, nil, nil
	}
	outs, err := r.applyClaimed(ctx, tx, claimed, bh, batched)
	if err != nil {
		return nil, nil, err
	}
	last := &pgx.Batch{}
	r.queueResolve(last, outs)
	if err := tx.CommitWith(ctx, last); err != nil {
		return nil, nil, err
	}
	return claimed, outs, nil
}

// applyClaimed applies the claimed entries in tx, under the span of the
// batch.
func (r *Relay) applyClaimed(ctx context.Context, tx pgx.Tx, claimed []Entry, bh BatchHandler, batched bool) ([]outcome, error) {
	ctx, span := r.startSpan(ctx, claimed, batched)
	defer span.End()
	if batched {
		return r.applyBatch(ctx, tx, bh, claimed)
	}
	outs := make([]outcome, 0, len(claimed))
	for i := range claimed {
		o, err := r.apply(ctx, tx, &claimed[i])
		if err != nil {
			return nil, err
		}
		outs = append(outs, o)
	}
	return outs, nil
}

// apply runs the handler inside a savepoint, so a rejected entry's partial
// writes are undone while the batch's other entries keep theirs. An error
// returned here means the transaction itself is unusable (e.g. the
// connection died): the whole batch rolls back and stays OPEN.
func (r *Relay) apply(ctx context.Context, tx pgx.Tx, e *Entry) (outcome, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return outcome{}, err
	}
	herr := r.handle(ctx, sp, e)
	if herr == nil {
		if err := sp.Commit(ctx); err != nil {
			return outcome{}, err
		}
		return r.outcome(ctx, e, nil), nil
	}
	if err := sp.Rollback(ctx); err != nil {
		if pe := (*panicError)(nil); errors.As(herr, &pe) {
			return outcome{}, &lostPanicError{entry: *e, panic: pe, err: err}
		}
		return outcome{}, errors.Join(herr, err)
	}
	if pe := (*panicError)(nil); errors.As(herr, &pe) {
		return r.outcome(ctx, e, herr), nil // charged even when out of time: the panic is the entry's
	}
	if ctx.Err() != nil {
		// Shutting down or out of time: not the entry's fault.
		return outcome{}, ctx.Err()
	}
	return r.outcome(ctx, e, herr), nil
}

// applyBatch runs HandleBatch over the whole claimed batch. Only classified
// business outcomes are accepted per entry (they wrote nothing); anything
// technical fails the batch, which is then retried entry by entry.
func (r *Relay) applyBatch(ctx context.Context, tx pgx.Tx, bh BatchHandler, claimed []Entry) ([]outcome, error) {
	es := make([]*Entry, len(claimed))
	for i := range claimed {
		es[i] = &claimed[i]
	}
	results, err := r.handleBatch(ctx, tx, bh, es)
	if err == nil && len(results) != len(es) {
		err = fmt.Errorf("%d results for %d entries", len(results), len(es))
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &batchFailedError{err: err}
	}
	outs := make([]outcome, len(es))
	for i, res := range results {
		if res != nil {
			if d, _ := Classify(res); d == Technical {
				return nil, &batchFailedError{err: fmt.Errorf("entry %d: %w", es[i].ID, res)}
			}
		}
		outs[i] = r.outcome(ctx, es[i], res)
	}
	return outs, nil
}

func (r *Relay) resolve(ctx context.Context, tx pgx.Tx, outs []outcome) error {
	b := &pgx.Batch{}
	r.queueResolve(b, outs)
	return tx.SendBatch(ctx, b).Close()
}

// queueResolve queues the statement that writes outs onto b.
func (r *Relay) queueResolve(b *pgx.Batch, outs []outcome) {
	ids := make([]int64, len(outs))
	statuses := make([]string, len(outs))
	attempts := make([]int32, len(outs))
	delays := make([]int64, len(outs))
	lastErrs := make([]*string, len(outs))
	reasons := make([]*string, len(outs))
	for i, o := range outs {
		ids[i], statuses[i], attempts[i] = o.id, string(o.status), int32(o.attempts)
		delays[i], lastErrs[i], reasons[i] = o.delay.Milliseconds(), o.lastError, o.parkReason
	}
	b.Queue(r.q.resolveBatch, ids, statuses, attempts, delays, lastErrs, reasons)
}

// failureWait is the relay's wait after its failures-th failed batch in a
// row: TechnicalBackoff's growing delay, capped at OutageProbeInterval when
// the database is unreachable, so that the relay polls a database that is
// down instead of sleeping past its return.
func failureWait(cfg Config, err error, failures int) time.Duration {
	wait := cfg.TechnicalBackoff.Delay(failures)
	if pgdb.IsUnavailable(err) {
		wait = min(wait, cfg.OutageProbeInterval)
	}
	return wait
}
