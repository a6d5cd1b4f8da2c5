package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgnotify"
	"github.com/lossless-dev/lossless/pkg/retry"
)

// rollbackTimeout bounds the rollback of a batch that could not be recorded;
// if the server does not answer in time the connection is closed, which ends
// the transaction just as well.
const rollbackTimeout = 5 * time.Second

// Relay claims outbox rows, dispatches each to the Dispatcher of its event
// type and records the outcome. Run any number of relays (one per replica)
// on one table: claims never overlap (each batch holds its rows' locks until
// it is recorded), and events of one aggregate dispatch in id order across
// all of them.
type Relay struct {
	pool        *pgxpool.Pool // a pool, not a pgdb.DB: see NewRelay
	dispatchers map[string]Dispatcher
	cfg         Config
	log         *slog.Logger
	policy      retry.Backoff
	m           instruments
	// circuits holds the circuit of each event type's dependency (several
	// types may share one, WithDependency); circuitList each circuit once.
	circuits    map[string]*Circuit
	circuitList []*Circuit
	// slowTypes are the event types in slow mode (WithSlowDispatch) that
	// have a dispatcher; the lock claim leaves them to slowLoop (lease.go).
	slowTypes []string
	slowWake  chan struct{}
	leaseSeq  atomic.Int64 // makes each lease claim's token unique

	running atomic.Bool
	// journalPool is the journal's pool while Run runs; a ProcessBatch
	// outside Run opens one for its batch.
	journalPool atomic.Pointer[pgxpool.Pool]
	// rewind is the lowest id announced by NOTIFY since the last claim
	// (math.MaxInt64: none); a value behind the cursor is a late commit.
	rewind atomic.Int64
	wake   chan struct{}
	stats  atomic.Pointer[Stats]

	// beginClaim opens a claim transaction (qBeginClaim with the lease);
	// beginStmts are its statements one by one, for the lock claim's batch
	// (the extended protocol takes one statement at a time).
	beginClaim string
	beginStmts []string
	// q are the relay's statements in its schema.
	q queries
	// now is the clock (WithClock).
	now func() time.Time

	// inFlight is held shared while a batch dispatches and exclusively while
	// a suspect event dispatches alone (journal.go), so that a crash then
	// can be charged to that event.
	inFlight sync.RWMutex

	// claimMu serialises the claims of this relay (its batches never
	// overlap); the fields below belong to the claim.
	claimMu   sync.Mutex
	cursor    int64
	lastSweep time.Time     // when the last sweep finished
	sweepGap  time.Duration // wait before the next sweep: SweepInterval, or more after a slow sweep
	excluded  []string      // event types the last claim left alone (circuit open)
}

// Stats is a snapshot of the outbox table, for metrics, the runbook and
// admin endpoints.
type Stats struct {
	// Pending counts rows not yet published and not FAILED (PENDING and
	// being dispatched), capped at Config.StatsCountLimit.
	Pending int64
	// Failed counts FAILED rows (within the same capped scan).
	Failed int64
	// OldestPendingAge is the age (now - created_at) of the oldest pending
	// row; 0 when there is none. A dead relay shows here first.
	OldestPendingAge time.Duration
}

type instruments struct {
	dispatched metric.Int64Counter
	errors     metric.Int64Counter
	failed     metric.Int64Counter
	unsettled  metric.Int64Counter
	circuit    metric.Int64Counter
}

// NewRelay returns a relay on the outbox in the schema named by WithSchema
// (default DefaultSchema); dispatchers are keyed by event type. An event
// whose type has no dispatcher goes to FAILED (permanent), never silently
// dropped. meter may be nil (no metrics). The relay needs a pool, not a
// connection: it holds one connection per batch in flight, listens on a
// dedicated one and opens a small pool of its own for the dispatch journal
// from the pool's configuration.
func NewRelay(pool *pgxpool.Pool, dispatchers map[string]Dispatcher, cfg Config, logger *slog.Logger, meter metric.Meter, opts ...Option) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("outbox: NewRelay: nil pool")
	}
	if logger == nil {
		return nil, errors.New("outbox: NewRelay: nil logger")
	}
	if len(dispatchers) == 0 {
		return nil, errors.New("outbox: NewRelay: no dispatchers")
	}
	for typ, d := range dispatchers {
		if d == nil {
			return nil, fmt.Errorf("outbox: NewRelay: nil dispatcher for %q", typ)
		}
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	if o.now == nil {
		return nil, errors.New("outbox: NewRelay: nil clock")
	}
	if meter == nil {
		meter = noop.NewMeterProvider().Meter("")
	}
	r := &Relay{
		pool:        pool,
		dispatchers: dispatchers,
		cfg:         cfg,
		log:         logger.With("component", "outbox.relay", "relay_id", cfg.RelayID, "schema", o.schema),
		policy:      retry.Backoff{Base: cfg.BackoffBase, Max: cfg.BackoffMax},
		wake:        make(chan struct{}, 1),
		slowWake:    make(chan struct{}, 1),
		beginClaim:  fmt.Sprintf(qBeginClaim, cfg.LeaseDuration.Milliseconds(), quoteLiteral(cfg.RelayID)),
		q:           newQueries(o.schema),
		now:         o.now,
	}
	r.beginStmts = strings.Split(r.beginClaim, ";\n")
	r.rewind.Store(math.MaxInt64)
	for _, typ := range o.slow {
		if _, ok := dispatchers[typ]; ok && !slices.Contains(r.slowTypes, typ) {
			r.slowTypes = append(r.slowTypes, typ) // a type without a dispatcher goes to FAILED by the lock claim
		}
	}
	if err := r.initMetrics(meter); err != nil {
		return nil, err
	}
	r.circuits = make(map[string]*Circuit, len(dispatchers))
	byName := map[string]*Circuit{}
	ccfg := CircuitConfig{Threshold: cfg.CircuitThreshold, ProbeInterval: cfg.CircuitProbeInterval, ProbeIntervalMax: cfg.CircuitProbeIntervalMax}
	for _, typ := range slices.Sorted(maps.Keys(dispatchers)) {
		name := o.dependencies[typ]
		if name == "" {
			name = typ
		}
		c, ok := byName[name]
		if !ok {
			c = NewCircuit(name, ccfg, r.circuitChanged)
			byName[name] = c
			r.circuitList = append(r.circuitList, c)
		}
		r.circuits[typ] = c
	}
	return r, nil
}

// circuitChanged counts and logs a circuit's transition. When a circuit
// closes, the rows of its dependency (left alone while it was open, never
// backed off for the outage) are due: the relay rewinds its cursor to the
// start of the index and wakes, so they go out now rather than at the next
// sweep.
func (r *Relay) circuitChanged(name string, from, to CircuitState) {
	r.m.circuit.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("dependency", name), attribute.String("to", to.String())))
	switch to {
	case CircuitOpen:
		if from == CircuitClosed {
			r.log.Warn("outbox dependency unavailable; circuit open, its events wait without being charged", "dependency", name,
				"probe_interval", r.cfg.CircuitProbeInterval)
		}
	case CircuitClosed:
		r.log.Info("outbox dependency answered; circuit closed, dispatching its events", "dependency", name)
		r.rewindTo(1)
		r.signal()
	}
}

func (r *Relay) initMetrics(meter metric.Meter) error {
	var err error
	var errs []error
	add := func(e error) { errs = append(errs, e) }
	r.m.dispatched, err = meter.Int64Counter("outbox.events.dispatched",
		metric.WithDescription("Events dispatched successfully and moved to outbox_published."))
	add(err)
	r.m.errors, err = meter.Int64Counter("outbox.dispatch.errors",
		metric.WithDescription("Failed dispatch attempts, by error kind (transient, permanent)."))
	add(err)
	r.m.failed, err = meter.Int64Counter("outbox.events.moved_to_failed",
		metric.WithDescription("Events moved to FAILED (permanent error, unknown type, attempts exhausted)."))
	add(err)
	r.m.unsettled, err = meter.Int64Counter("outbox.events.unsettled",
		metric.WithDescription("Dispatched events whose batch could not be recorded afterwards; they are dispatched again (duplicates)."))
	add(err)
	r.m.circuit, err = meter.Int64Counter("outbox.circuit.transitions",
		metric.WithDescription("State changes of a dependency's circuit, by dependency and new state (open, half_open, closed)."))
	add(err)
	circuitState, err := meter.Int64ObservableGauge("outbox.circuit.state",
		metric.WithDescription("State of each dependency's circuit: 0 closed, 1 half-open (a probe in flight), 2 open (its events are not dispatched)."))
	add(err)
	pending, err := meter.Int64ObservableGauge("outbox.events.pending",
		metric.WithDescription("Rows PENDING, in flight or not (capped scan), refreshed every stats interval."))
	add(err)
	failed, err := meter.Int64ObservableGauge("outbox.events.failed",
		metric.WithDescription("Rows in FAILED, waiting for an operator."))
	add(err)
	age, err := meter.Float64ObservableGauge("outbox.events.oldest_pending_age",
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest PENDING row; 0 when none."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("outbox: metrics: %w", err)
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, c := range r.circuitList {
			o.ObserveInt64(circuitState, int64(c.State()), metric.WithAttributes(attribute.String("dependency", c.Name())))
		}
		return nil
	}, circuitState)
	if err != nil {
		return fmt.Errorf("outbox: metrics: %w", err)
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := r.stats.Load()
		if s == nil {
			return nil
		}
		o.ObserveInt64(pending, s.Pending)
		o.ObserveInt64(failed, s.Failed)
		o.ObserveFloat64(age, s.OldestPendingAge.Seconds())
		return nil
	}, pending, failed, age)
	if err != nil {
		return fmt.Errorf("outbox: metrics: %w", err)
	}
	return nil
}

// Run claims and dispatches with BatchesInFlight loops until ctx is
// cancelled; then records its in-flight batches (undispatched rows are
// released) and returns nil. It also listens for NOTIFY on a dedicated
// connection, deletes expired published rows and refreshes the gauges.
// Database errors are logged and retried with backoff; Run returns an error
// only when called twice concurrently or when the pool's configuration
// cannot be copied for the dispatch journal (journal.go).
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: relay already running")
	}
	defer r.running.Store(false)
	jp, err := r.newJournalPool(r.cfg.BatchesInFlight) // one statement per batch at a time
	if err != nil {
		return err
	}
	r.journalPool.Store(jp)
	defer func() { r.journalPool.Store(nil); jp.Close() }() // after the loops below
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { r.listen(ctx) })
	wg.Go(func() { r.maintain(ctx) })

	for range r.cfg.BatchesInFlight {
		wg.Go(func() { r.loop(ctx) })
	}
	if len(r.slowTypes) > 0 {
		wg.Go(func() { r.slowLoop(ctx) })
	}
	return nil
}

// loop is one of Run's BatchesInFlight batch loops: while one loop
// dispatches its batch, another claims the next.
func (r *Relay) loop(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		full, err := r.ProcessBatch(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			delay := r.failureWait(err, failures)
			r.log.Warn("outbox batch failed; backing off", "error", err, "attempt", failures, "delay", delay)
			sleep(ctx, delay)
			continue
		}
		failures = 0
		if full {
			r.signal() // a backlog: keep the other loops busy too
			continue
		}
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// ProcessBatch claims one batch, dispatches it and records the outcome, all
// in one transaction whose row locks are the claim. It reports whether the
// claim was full (more rows are probably waiting). Run's loops call it;
// operator commands and tests may call it directly. Concurrent calls claim
// one after another and then work in parallel.
//
// The transaction is bounded by LeaseDuration: on the client by a context
// deadline (dispatch is cut off at 80% of it), on the server by
// idle_in_transaction_session_timeout, so a relay that hangs or vanishes
// releases its rows to the other relays within one lease. It is not tied to
// ctx: once claimed, a batch is settled even when Run is being stopped (the
// dispatch itself stops, and undispatched rows are released unwritten).
func (r *Relay) ProcessBatch(ctx context.Context) (full bool, err error) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseDuration)
	defer cancel()
	// The dispatch cut-off counts from the claim, like the lease: measured
	// from the dispatch's start, a slow journal write left the settlement
	// too little of the lease, and a batch dispatched but not recorded is
	// dispatched again.
	cutoff := time.Now().Add(r.cfg.LeaseDuration * 8 / 10)
	// The claim's transaction; it begins in the claim's batch.
	tx, err := r.beginTx(tctx)
	if err != nil {
		return false, fmt.Errorf("outbox: begin claim: %w", err)
	}
	defer func() { // a no-op after the commit; bounded even when tctx has expired
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer rcancel()
		_ = tx.Rollback(rctx)
	}()
	r.claimMu.Lock()
	rows, scanned, err := r.claim(tctx, tx, r.now())
	r.claimMu.Unlock()
	if err != nil {
		return false, err
	}
	var outcomes []outcome
	if len(rows) > 0 {
		// The journal first, in a commit of its own: a dispatch that kills
		// the process rolls this transaction back, but not that record.
		jp := r.journalPool.Load()
		if jp == nil { // outside Run
			if jp, err = r.newJournalPool(1); err != nil {
				return false, err
			}
			defer jp.Close() // after forget below
		}
		j := &journal{db: jp, suspects: map[int64]bool{}, crashes: map[int64]int{}}
		ids := make([]int64, len(rows))
		for i := range rows {
			ids[i] = rows[i].id
		}
		if err := r.journalStart(tctx, ids, false, j); err != nil {
			r.forget(ctx, j)
			return false, err
		}
		settled := false
		defer func() {
			if !settled {
				r.forget(ctx, j)
			}
		}()
		if rows, err = r.chargeCrashes(tctx, tx, rows, j); err != nil {
			return false, err
		}
		dctx, dcancel := context.WithDeadline(ctx, cutoff)
		if len(j.suspects) > 0 {
			outcomes = r.dispatchAlone(dctx, tctx, rows, j)
		} else {
			r.inFlight.RLock()
			outcomes = r.dispatchAll(dctx, rows)
			r.inFlight.RUnlock()
		}
		dcancel()
		if err := r.settle(tctx, tx, rows, outcomes, j); err != nil {
			r.unsettled(tctx, rows, outcomes, err)
			return false, err
		}
		settled = true
	} else if err := tx.Commit(tctx); err != nil {
		return false, fmt.Errorf("outbox: commit batch: %w", err)
	}
	r.count(tctx, rows, outcomes)
	return scanned >= r.cfg.BatchSize, nil
}

// unclaimable lists the event types whose circuit is open with no probe due:
// the claim leaves their rows alone. Empty (and free in the claim) while
// every dependency is reachable.
func (r *Relay) unclaimable(now time.Time) []string {
	types := []string{} // not nil: "<> ALL(NULL)" would exclude every row
	for typ, c := range r.circuits {
		if !c.Claimable(now) {
			types = append(types, typ)
		}
	}
	return types
}

type claimedRow struct {
	tid pgtype.TID // physical address, stable while the claim holds the row lock
	id  int64
	ev  Event
}

// claim begins tx and claims a batch in it, in one round trip.
func (r *Relay) claim(ctx context.Context, tx *pgdb.Tx, now time.Time) ([]claimedRow, int, error) {
	from := r.cursor
	if rw := r.rewind.Swap(math.MaxInt64); rw-1 < from {
		from = rw - 1 // a late commit behind the cursor: go back for it
	}
	sweep := now.Sub(r.lastSweep) >= max(r.sweepGap, r.cfg.SweepInterval) || now.Before(r.lastSweep)
	if sweep {
		from = 0
		// A sweep walks the dead index entries of every row published since
		// vacuum last ran; while a long transaction holds vacuum back, that
		// walk grows to seconds. Spacing sweeps by four times their duration
		// keeps them under a fifth of the relay's time, instead of every
		// claim becoming a sweep (B2 measured the relay at ~1% of its rate
		// that way).
		defer func() {
			done := r.now()
			r.lastSweep, r.sweepGap = done, 4*done.Sub(now)
		}()
	}
	excluded := r.unclaimable(now)
	for _, typ := range r.excluded {
		if !slices.Contains(excluded, typ) {
			// A probe is due (or the circuit closed): the type's rows lie
			// behind the cursor, which moved on while they were excluded.
			from = 0
			break
		}
	}
	r.excluded = excluded
	if len(r.slowTypes) > 0 {
		excluded = slices.Concat(excluded, r.slowTypes) // leased by slowLoop
	}
	var (
		out       []claimedRow
		scanned   int
		scannedTo = from
	)
	b := &pgx.Batch{}
	b.Queue(r.q.claim, from, r.cfg.BatchSize, now, excluded).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				row       claimedRow
				sv, att   int32
				headers   []byte
				claimable bool
			)
			ev := &row.ev
			if err := rows.Scan(&row.tid, &row.id, &ev.ID, &ev.AggregateType, &ev.AggregateID, &ev.Type, &sv,
				&ev.Payload, &headers, &ev.OccurredAt, &att, &claimable); err != nil {
				return fmt.Errorf("scan: %w", err)
			}
			scanned++
			scannedTo = row.id
			if !claimable {
				continue // behind an earlier event of its aggregate
			}
			ev.SchemaVersion, ev.Attempts = int(sv), int(att)
			var err error
			if ev.Headers, err = decodeHeaders(headers); err != nil {
				r.log.Warn("outbox event with unreadable headers; dispatching without them", "event_id", ev.ID, "error", err)
			}
			out = append(out, row)
		}
		return rows.Err()
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, 0, fmt.Errorf("outbox: claim: %w", err)
	}
	// Move the cursor past everything scanned, claimed or not: skipped rows
	// (locked by another relay, blocked behind their aggregate) are another
	// relay's or the next sweep's. A sweep that found nothing keeps the
	// cursor where it was.
	if scannedTo > r.cursor || scanned > 0 {
		r.cursor = scannedTo
	}
	return out, scanned, nil
}

type outcomeKind int

const (
	outcomeReleased    outcomeKind = iota // not dispatched; left as it was
	outcomePublished                      // dispatched
	outcomeRetry                          // transient failure
	outcomeFailed                         // permanent failure
	outcomeUnavailable                    // dependency unavailable; left as it was, not charged
)

type outcome struct {
	kind   outcomeKind
	commit Commit
	err    error
}

// dispatchAll dispatches a claimed batch: aggregates in parallel (up to
// DispatchConcurrency), the events of one aggregate one after another in id
// order, stopping that aggregate at its first failure so that no later event
// overtakes it. ctx carries the cut-off, well before the claim transaction's
// deadline, so that a slow destination cannot outlive the claim.
func (r *Relay) dispatchAll(ctx context.Context, rows []claimedRow) []outcome {
	out := make([]outcome, len(rows))
	var groups [][]int
	byAgg := make(map[string]int, len(rows))
	for i, row := range rows { // rows are in id order
		g, ok := byAgg[row.ev.AggregateID]
		if !ok {
			g = len(groups)
			byAgg[row.ev.AggregateID] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	runGroup := func(g []int) {
		for _, i := range g {
			if ctx.Err() != nil {
				return // the rest stays outcomeReleased
			}
			out[i] = r.dispatchOne(ctx, rows[i].ev)
			if out[i].kind != outcomePublished {
				return
			}
		}
	}
	workers := min(r.cfg.DispatchConcurrency, len(groups))
	if workers <= 1 {
		for _, g := range groups {
			runGroup(g)
		}
		return out
	}
	// Workers take the next group by index: no channel hand-off per group.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for g := next.Add(1) - 1; g < int64(len(groups)); g = next.Add(1) - 1 {
				runGroup(groups[g])
			}
		})
	}
	wg.Wait()
	return out
}

func (r *Relay) dispatchOne(ctx context.Context, ev Event) (o outcome) {
	d, ok := r.dispatchers[ev.Type]
	if !ok {
		return outcome{kind: outcomeFailed, err: fmt.Errorf("no dispatcher for event type %q", ev.Type)}
	}
	c := r.circuits[ev.Type]
	if !c.Allow(r.now()) {
		return outcome{kind: outcomeReleased, err: errCircuitOpen}
	}
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("outbox dispatcher panicked", "event_id", ev.ID, "event_type", ev.Type, "panic", p, "stack", string(debug.Stack()))
			c.Success() // the event's fault, not the dependency's
			o = outcome{kind: outcomeRetry, err: fmt.Errorf("dispatcher panicked: %v", p)}
		}
	}()
	commit, err := d.Dispatch(ctx, ev)
	switch {
	case err == nil:
		c.Success()
		return outcome{kind: outcomePublished, commit: commit}
	case retry.IsPermanent(err):
		c.Success()
		// The prefix tells operators reading last_error (the runbook's
		// queries) a refusal from an exhausted retry or an unknown type.
		return outcome{kind: outcomeFailed, err: fmt.Errorf("permanent: %w", err)}
	case ctx.Err() != nil && (errors.Is(err, ctx.Err()) || IsUnavailable(err)):
		// Cut off by shutdown or the lease deadline: not the event's fault,
		// and it says nothing about the dependency.
		c.Abandon()
		return outcome{kind: outcomeReleased, err: err}
	case IsUnavailable(err):
		c.Failure(r.now())
		return outcome{kind: outcomeUnavailable, err: err}
	default:
		// The dependency answered; the error is this event's (backoff).
		c.Success()
		return outcome{kind: outcomeRetry, err: err}
	}
}

// errCircuitOpen is the outcome of an event not dispatched because its
// dependency's circuit is open (claimed before it opened, or with a probe).
var errCircuitOpen = errors.New("dependency circuit open")

// settle records the outcome of a batch and commits it, in one round trip
// when no event carries a Commit (commitSettled): published rows move to
// outbox_published, failed ones are updated, released ones are left alone,
// and the batch's journal rows are deleted.
//
// Commits run first, in a savepoint that goes out with the first statement
// they send; the settlement follows in the batch that commits. When a
// Commit fails, or the settlement after them does, the work is rolled back
// to that savepoint (the row locks are kept) and each row is moved with its
// Commit alone, so one bad Commit does not hold back the others; a row
// whose own Commit fails becomes a transient failure. Savepoints cost a
// subtransaction each: one per batch with Commits, one per row only on this
// rare path, each released; the batch's own is released by the COMMIT.
func (r *Relay) settle(ctx context.Context, tx *pgdb.Tx, rows []claimedRow, outs []outcome, j *journal) error {
	now := r.now()
	var (
		published []int
		sp        *pgdb.Tx
	)
	for i := range outs {
		if outs[i].kind == outcomePublished {
			published = append(published, i)
			if outs[i].commit != nil && sp == nil {
				sp = tx.Savepoint()
			}
		}
	}
	if sp == nil {
		return r.commitSettled(ctx, tx, rows, outs, published, j, now)
	}
	err := r.runCommits(ctx, sp, rows, outs, published)
	if err == nil {
		if err = r.commitSettled(ctx, tx, rows, outs, published, j, now); err == nil || tx.Closed() {
			return err
		}
	}
	if ctx.Err() != nil || tx.Conn().IsClosed() {
		return fmt.Errorf("outbox: mark published: %w", err)
	}
	if rerr := sp.Rollback(ctx); rerr != nil || tx.Conn().PgConn().TxStatus() != 'T' {
		// An aborted transaction with no savepoint to go back to: the
		// settlement itself failed, not a Commit.
		return fmt.Errorf("outbox: mark published: %w", errors.Join(err, rerr))
	}
	r.log.Warn("outbox batch mark failed; marking one by one", "error", err, "rows", len(published))
	for _, i := range published {
		err := pgdb.InTx(ctx, tx, r.log, func(sp *pgdb.Tx) error { return r.moveAndCommit(ctx, sp, rows, outs, []int{i}, now) })
		if err != nil {
			if ctx.Err() != nil || tx.Conn().IsClosed() {
				return fmt.Errorf("outbox: mark published: %w", err)
			}
			outs[i] = outcome{kind: outcomeRetry, err: fmt.Errorf("commit after dispatch: %w", err)}
		}
	}
	return r.commitSettled(ctx, tx, rows, outs, nil, j, now)
}

// runCommits runs the Commits of rows[idx] in tx.
func (r *Relay) runCommits(ctx context.Context, tx pgx.Tx, rows []claimedRow, outs []outcome, idx []int) error {
	for _, i := range idx {
		if c := outs[i].commit; c != nil {
			if err := c(ctx, tx); err != nil {
				return fmt.Errorf("commit of event %s: %w", rows[i].ev.ID, err)
			}
		}
	}
	return nil
}

func (r *Relay) moveAndCommit(ctx context.Context, tx pgx.Tx, rows []claimedRow, outs []outcome, idx []int, now time.Time) error {
	if _, err := tx.Exec(ctx, r.q.markPublished, publishedTIDs(rows, idx), now); err != nil {
		return fmt.Errorf("outbox: mark published: %w", err)
	}
	return r.runCommits(ctx, tx, rows, outs, idx)
}

func publishedTIDs(rows []claimedRow, idx []int) []pgtype.TID {
	tids := make([]pgtype.TID, len(idx))
	for k, i := range idx {
		tids[k] = rows[i].tid
	}
	return tids
}

// commitSettled sends, with the COMMIT, qMarkPublished for rows[published]
// (none: moved already), qMarkUnpublished for the failed rows and
// qJournalDone for the batch's journal rows. qMarkPublished fails in the
// server when it moves fewer rows than it was given, so such a batch is not
// committed (pgdb.Tx.CommitWith).
func (r *Relay) commitSettled(ctx context.Context, tx *pgdb.Tx, rows []claimedRow, outs []outcome, published []int, j *journal, now time.Time) error {
	b := &pgx.Batch{}
	if len(published) > 0 {
		queueExec(b, "mark published", r.q.markPublished, publishedTIDs(rows, published), now)
	}
	r.queueMarkUnpublished(b, rows, outs, now)
	queueExec(b, "journal", r.q.journalDone, j.settledIDs())
	if err := tx.CommitWith(ctx, b); err != nil {
		return fmt.Errorf("outbox: commit batch: %w", err)
	}
	return nil
}

// queueExec queues sql on b, its error prefixed with what.
func queueExec(b *pgx.Batch, what, sql string, args ...any) {
	b.Queue(sql, args...).Fn = func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("outbox: %s: %w", what, err)
		}
		return nil
	}
}

// queueMarkUnpublished queues qMarkUnpublished for the failed rows, if any.
func (r *Relay) queueMarkUnpublished(b *pgx.Batch, rows []claimedRow, outs []outcome, now time.Time) {
	var (
		tids   []pgtype.TID
		ids    []int64
		status []string
		errs   []string
		nexts  []*time.Time
	)
	for i, o := range outs {
		if o.kind == outcomePublished || o.kind == outcomeReleased || o.kind == outcomeUnavailable {
			continue // an outage is not the event's fault: no attempt, no backoff
		}
		ev := rows[i].ev
		msg := truncate(o.err.Error(), 2000)
		switch {
		case o.kind == outcomeFailed:
		case ev.Attempts >= r.cfg.MaxAttempts:
			msg = fmt.Sprintf("attempts exhausted (%d): %s", ev.Attempts, msg)
		default:
			next := now.Add(r.policy.Delay(ev.Attempts))
			tids, ids, status, errs, nexts = append(tids, rows[i].tid), append(ids, rows[i].id), append(status, "PENDING"), append(errs, msg), append(nexts, &next)
			continue
		}
		tids, ids, status, errs, nexts = append(tids, rows[i].tid), append(ids, rows[i].id), append(status, "FAILED"), append(errs, msg), append(nexts, nil)
	}
	if len(ids) > 0 {
		queueExec(b, "mark unpublished", r.q.markUnpublished, ids, status, errs, nexts, tids)
	}
}

// count updates the metrics and logs of a committed batch; the success
// counter is added once per event type, not once per event.
func (r *Relay) count(ctx context.Context, rows []claimedRow, outs []outcome) {
	var published map[string]int64
	for i, o := range outs {
		ev := rows[i].ev
		typ := attribute.String("event_type", ev.Type)
		switch {
		case o.kind == outcomePublished:
			if published == nil {
				published = make(map[string]int64, 1)
			}
			published[ev.Type]++
		case o.kind == outcomeUnavailable:
			r.m.errors.Add(ctx, 1, metric.WithAttributes(typ, attribute.String("error.kind", "unavailable")))
			r.log.Debug("outbox dispatch found its dependency unavailable", "event_id", ev.ID, "event_type", ev.Type, "error", o.err)
		case o.kind == outcomeRetry && ev.Attempts < r.cfg.MaxAttempts:
			r.m.errors.Add(ctx, 1, metric.WithAttributes(typ, attribute.String("error.kind", "transient")))
			r.log.Warn("outbox dispatch failed; will retry", "event_id", ev.ID, "event_type", ev.Type, "attempt", ev.Attempts, "error", o.err)
		case o.kind == outcomeRetry || o.kind == outcomeFailed:
			kind := "permanent"
			if o.kind == outcomeRetry {
				kind = "transient" // attempts exhausted
			}
			r.m.errors.Add(ctx, 1, metric.WithAttributes(typ, attribute.String("error.kind", kind)))
			r.m.failed.Add(ctx, 1, metric.WithAttributes(typ))
			r.log.Error("outbox event moved to FAILED", "event_id", ev.ID, "event_type", ev.Type, "aggregate_id", ev.AggregateID, "attempt", ev.Attempts, "error", o.err)
		}
	}
	for typ, n := range published {
		r.m.dispatched.Add(ctx, n, metric.WithAttributes(attribute.String("event_type", typ)))
	}
}

// unsettled reports a batch whose outcome could not be recorded: the
// transaction is rolled back, every row is claimable again, and the events
// that were dispatched will be dispatched a second time (at-least-once;
// consumers deduplicate on event_id).
func (r *Relay) unsettled(ctx context.Context, rows []claimedRow, outs []outcome, err error) {
	n := 0
	for _, o := range outs {
		if o.kind == outcomePublished {
			n++
		}
	}
	if n == 0 {
		return
	}
	r.m.unsettled.Add(ctx, int64(n))
	r.log.Warn("outbox batch not recorded after dispatch; its events will be dispatched again", "dispatched", n, "rows", len(rows), "error", err)
}

// Stats reads the current numbers from the database (bounded queries:
// counts stop at StatsCountLimit).
func (r *Relay) Stats(ctx context.Context) (Stats, error) {
	var (
		s      Stats
		oldest *time.Time
	)
	now := r.now()
	rows, err := r.pool.Query(ctx, r.q.stats, r.cfg.StatsCountLimit)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	defer rows.Close()
	if rows.Next() {
		if err := rows.Scan(&s.Pending, &s.Failed, &oldest); err != nil {
			return Stats{}, fmt.Errorf("outbox: stats: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	if oldest != nil && now.After(*oldest) {
		s.OldestPendingAge = now.Sub(*oldest)
	}
	return s, nil
}

// Cleanup deletes outbox_published rows older than the retention, in bounded
// batches, and returns how many it deleted. Run calls it every
// CleanupInterval.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	cutoff := r.now().Add(-r.cfg.Retention)
	var total int64
	for range 100 { // at most 100 batches per call; the next interval continues
		tag, err := r.pool.Exec(ctx, r.q.cleanup, cutoff, r.cfg.CleanupBatch)
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.cfg.CleanupBatch) {
			break
		}
	}
	return total, nil
}

// maintain refreshes the gauges every StatsInterval and deletes expired
// published rows every CleanupInterval.
func (r *Relay) maintain(ctx context.Context) {
	refresh := func() {
		s, err := r.Stats(ctx)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("outbox stats failed", "error", err)
			}
			return
		}
		r.stats.Store(&s)
	}
	refresh()
	statsT := time.NewTicker(r.cfg.StatsInterval)
	defer statsT.Stop()
	cleanT := time.NewTicker(r.cfg.CleanupInterval)
	defer cleanT.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-statsT.C:
			refresh()
		case <-cleanT.C:
			n, err := r.Cleanup(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				r.log.Warn("outbox cleanup failed", "error", err)
			case n > 0:
				r.log.Info("outbox cleanup deleted published rows", "rows", n, "retention", r.cfg.Retention)
			}
			if err := r.collectJournal(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox journal cleanup failed", "error", err)
			}
		}
	}
}

// listen wakes the batch loop on every notification of the outbox channel,
// whose payload is the lowest id the notifying Append inserted: the
// cursor rewinds to it, so a row committed late with a lower id than the
// cursor is not skipped (the commit-order trap). pgnotify calls back with an
// empty payload after every (re)connect: notifications sent while nobody
// listened are lost, so the next claim starts from the beginning of the
// index instead of waiting for the sweep.
func (r *Relay) listen(ctx context.Context) {
	pgnotify.Listen(ctx, r.pool.Config().ConnConfig, r.q.notifyChannel, r.policy, r.log, func(payload string) {
		id, err := strconv.ParseInt(payload, 10, 64)
		if err != nil {
			id = 1 // (re)connected, or a payload not from Append: rewind fully
		}
		r.rewindTo(id)
		r.signal()
	})
}

// rewindTo makes the next claim start at id at the latest.
func (r *Relay) rewindTo(id int64) {
	for {
		cur := r.rewind.Load()
		if id >= cur || r.rewind.CompareAndSwap(cur, id) {
			return
		}
	}
}

func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
	select {
	case r.slowWake <- struct{}{}:
	default:
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// truncate cuts s to at most n bytes on a rune boundary: a cut inside a
// multi-byte character would be invalid UTF-8, which PostgreSQL rejects,
// failing the statement that records the whole batch.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings,
// the default since PostgreSQL 9.1), for the one SET that takes no parameters.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// failureWait is a relay loop's wait after its failures-th failed batch in a
// row: the growing backoff, capped at OutageProbeInterval when the database
// is unreachable, so that the loop polls a database that is down instead of
// sleeping past its return.
func (r *Relay) failureWait(err error, failures int) time.Duration {
	wait := r.policy.Delay(failures)
	if pgdb.IsUnavailable(err) {
		wait = min(wait, r.cfg.OutageProbeInterval)
	}
	return wait
}
