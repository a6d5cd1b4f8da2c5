package outbox

// The relay, the outbox's second half, is one loop: claim a batch of due
// rows, dispatch each event, settle the outcomes, in the transaction that
// holds the claim. ProcessBatch is one turn of it, top to bottom; each step
// it names lives in a file of its own:
//
//   - claim: the lock claim (lockclaim.go) locks a batch in a transaction
//     held across the dispatch. Slow types are leased instead, with a
//     committed lease, by a loop of their own (slowLoop, lease.go).
//   - journal: the claimed ids are recorded in a commit of their own before
//     the dispatch, so that a dispatch that kills the process is charged to
//     its event (journal.go).
//   - dispatch: each event to its type's Dispatcher, aggregates in parallel,
//     each aggregate in order (dispatch.go), through its dependency's Circuit
//     (circuit.go), which holds back the events of a dependency that is down.
//   - settle: the outcomes recorded and committed in the claim's transaction
//     (settle.go), its COMMIT riding the batch that records them (claimtx.go).
//
// Around the loop: wake-ups on NOTIFY (wake.go), the gauges and the cleanup
// (maintain.go), the metrics (metrics.go).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/telemetry"
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
	meter = telemetry.MeterOrNoop(meter)
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
	r.newCircuits(o.dependencies)
	return r, nil
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

	// The lock claim: BatchesInFlight loops of ProcessBatch, so that while
	// one dispatches its batch another claims the next.
	for range r.cfg.BatchesInFlight {
		wg.Go(func() { r.loop(ctx) })
	}
	// The lease claim of the slow types: one loop, its dispatches in
	// parallel (lease.go).
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
		j, endJournal, err := r.openJournal(ctx, tctx, rows)
		if err != nil {
			return false, err
		}
		settled := false
		defer func() { endJournal(settled) }()
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

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
