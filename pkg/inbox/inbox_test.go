package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// bundle is one test's database and the inbox pieces on it.
type bundle struct {
	pool  *pgxpool.Pool
	store *inbox.Store
	ops   *inbox.Ops
}

func setup(t *testing.T) bundle {
	t.Helper()
	pool := pgtest.NewPool(t, inbox.Migrations(""))
	store, err := inbox.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := inbox.NewOps(pool)
	if err != nil {
		t.Fatal(err)
	}
	return bundle{pool: pool, store: store, ops: ops}
}

func msg(eventID, key, payload string) inbox.Message {
	return inbox.Message{Source: "test", EventID: eventID, EventType: "t.Event", SchemaVersion: 1,
		CorrelationKey: key, Payload: []byte(payload), MessageID: "m-" + eventID,
		Attributes: map[string]string{"event_id": eventID}, Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
}

func (b bundle) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b bundle) relay(t *testing.T, h inbox.Handler, cfg inbox.Config) *inbox.Relay {
	t.Helper()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 5 * time.Millisecond
	}
	r, err := inbox.NewRelay(b.pool, h, cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func drain(t *testing.T, r *inbox.Relay) {
	t.Helper()
	for range 100 {
		n, err := r.ProcessBatch(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
	t.Fatal("relay did not drain")
}

func TestIngest_RedeliveryIsANoOp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	m := msg("e1", "k1", "p")
	res, err := b.store.Ingest(ctx, []inbox.Message{m})
	if err != nil || res.Inserted != 1 {
		t.Fatalf("first ingest: %+v %v", res, err)
	}
	res, err = b.store.Ingest(ctx, []inbox.Message{m, m})
	if err != nil || res.Inserted != 0 || res.Duplicates != 2 || res.Conflicts != 0 {
		t.Fatalf("redelivery: %+v %v", res, err)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox`); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
	e, err := b.ops.Get(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if e.Traceparent == "" || e.MessageID != "m-e1" || e.Attributes["event_id"] != "e1" || e.Status != inbox.StatusOpen || e.CorrelationKey != "k1" {
		t.Fatalf("stored entry lost fields: %+v", e)
	}
}

func TestF4_ConcurrentCopiesStoreOneRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for round := range 20 {
		// Two batches share two keys in opposite order: the deadlock-prone
		// case, made safe by Ingest's canonical insert order.
		m1, m2 := msg(fmt.Sprintf("r%d-a", round), "k", "p"), msg(fmt.Sprintf("r%d-b", round), "k2", "p")
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range 4 {
			wg.Go(func() {
				batch := []inbox.Message{m1, m2}
				if i%2 == 1 {
					batch = []inbox.Message{m2, m1}
				}
				_, errs[i] = b.store.Ingest(ctx, batch)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM inbox`); n != 40 {
		t.Fatalf("rows = %d, want 40 (one per event)", n)
	}
}

func TestConflict_SameIDDifferentPayloadIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.store.Ingest(ctx, []inbox.Message{msg("e1", "k", "first")}); err != nil {
		t.Fatal(err)
	}
	res, err := b.store.Ingest(ctx, []inbox.Message{msg("e1", "k", "second")})
	if err != nil || res.Conflicts != 1 {
		t.Fatalf("conflict not detected: %+v %v", res, err)
	}
	// Redelivery of the conflicting message: recorded once.
	if _, err := b.store.Ingest(ctx, []inbox.Message{msg("e1", "k", "second")}); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox_conflicts WHERE event_id = 'e1' AND payload = 'second'`); n != 1 {
		t.Fatalf("conflict rows = %d, want 1 keeping the second payload", n)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE event_id = 'e1' AND payload = 'first'`); n != 1 {
		t.Fatal("first payload must stay in the inbox")
	}
	mon, err := inbox.NewMonitor(b.pool, inbox.MonitorConfig{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := mon.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mon.Snapshot().OpenConflicts; got != 1 {
		t.Fatalf("open conflicts gauge = %d, want 1", got)
	}
}

func TestPoison_StoredParkedNeverClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	p := msg("pubsub-message:42", "", "\xff\x00garbage")
	p.ParkReason, p.ParkError = inbox.ReasonPoison, "unparseable"
	res, err := b.store.Ingest(ctx, []inbox.Message{p})
	if err != nil || res.Poison != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	called := false
	drain(t, b.relay(t, inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Entry) error { called = true; return nil }), inbox.Config{}))
	if called {
		t.Fatal("relay must never claim a parked entry")
	}
	es, err := b.ops.List(ctx, inbox.ListFilter{Reason: inbox.ReasonPoison})
	if err != nil || len(es) != 1 || string(es[0].Payload) != "\xff\x00garbage" || es[0].LastError != "unparseable" {
		t.Fatalf("poison entry: %+v %v", es, err)
	}
}

// orderRecorder is a handler that records application order per key.
type orderRecorder struct {
	mu      sync.Mutex
	applied map[string][]string
}

func (o *orderRecorder) Handle(_ context.Context, _ pgx.Tx, e *inbox.Entry) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.applied[e.CorrelationKey] = append(o.applied[e.CorrelationKey], e.EventID)
	return nil
}

func TestClaim_OlderOpenEntryOfSameKeyBlocksNewer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.store.Ingest(ctx, []inbox.Message{msg("a1", "A", "p"), msg("a2", "A", "p"), msg("b1", "B", "p")}); err != nil {
		t.Fatal(err)
	}
	// a1 backs off (not due): a2 must wait behind it, b1 proceeds.
	if _, err := b.pool.Exec(ctx, `UPDATE inbox SET next_attempt_at = now() + interval '1 hour' WHERE event_id = 'a1'`); err != nil {
		t.Fatal(err)
	}
	rec := &orderRecorder{applied: map[string][]string{}}
	drain(t, b.relay(t, rec, inbox.Config{}))
	if len(rec.applied["A"]) != 0 || len(rec.applied["B"]) != 1 {
		t.Fatalf("applied %v: a2 must not overtake a1, B must proceed", rec.applied)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE inbox SET next_attempt_at = now() WHERE event_id = 'a1'`); err != nil {
		t.Fatal(err)
	}
	drain(t, b.relay(t, rec, inbox.Config{}))
	if got := fmt.Sprint(rec.applied["A"]); got != "[a1 a2]" {
		t.Fatalf("order of A = %s, want [a1 a2]", got)
	}
}

func TestRelays_SerializePerKeyInParallel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var batch []inbox.Message
	for i := range 30 {
		for k := range 10 {
			batch = append(batch, msg(fmt.Sprintf("k%d-%02d", k, i), fmt.Sprintf("k%d", k), "p"))
		}
	}
	if _, err := b.store.Ingest(ctx, batch); err != nil {
		t.Fatal(err)
	}
	rec := &orderRecorder{applied: map[string][]string{}}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 3 {
		r := b.relay(t, rec, inbox.Config{BatchSize: 7})
		wg.Go(func() { _ = r.Run(runCtx) })
	}
	waitfor.Condition(t, 20*time.Second, "all entries applied", func() bool {
		return b.count(t, `SELECT count(*) FROM inbox WHERE status = 'OPEN'`) == 0
	})
	cancel()
	wg.Wait()
	for k := range 10 {
		key := fmt.Sprintf("k%d", k)
		got := rec.applied[key]
		if len(got) != 30 {
			t.Fatalf("%s applied %d, want 30", key, len(got))
		}
		for i, id := range got {
			if id != fmt.Sprintf("%s-%02d", key, i) {
				t.Fatalf("%s out of order: %v", key, got)
			}
		}
	}
}

func TestTechnicalError_RetriesWithoutLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.store.Ingest(ctx, []inbox.Message{msg("e1", "k", "p")}); err != nil {
		t.Fatal(err)
	}
	fail := inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Entry) error { return errors.New("connection reset") })
	r := b.relay(t, fail, inbox.Config{MaxAttempts: 2, MaxAge: time.Nanosecond, TechnicalBackoff: retry.Backoff{Base: time.Millisecond, Max: time.Millisecond}})
	for range 5 {
		if _, err := b.pool.Exec(ctx, `UPDATE inbox SET next_attempt_at = now()`); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ProcessBatch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e, _ := b.ops.Get(ctx, 1)
	if e.Status != inbox.StatusOpen || e.Attempts != 5 || e.LastError != "connection reset" {
		t.Fatalf("technical failures must keep the entry OPEN and count: %+v", e)
	}
}

func TestDeferred_ParkedOnlyAfterAttemptsAndAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.store.Ingest(ctx, []inbox.Message{msg("e1", "k", "p")}); err != nil {
		t.Fatal(err)
	}
	notYet := inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Entry) error {
		return inbox.Defer("NOT_WAITING", errors.New("not waiting"))
	})
	r := b.relay(t, notYet, inbox.Config{MaxAttempts: 3, MaxAge: time.Hour, DeferBackoff: retry.Backoff{Base: time.Millisecond, Max: time.Millisecond}})
	step := func() inbox.Entry {
		if _, err := b.pool.Exec(ctx, `UPDATE inbox SET next_attempt_at = now()`); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ProcessBatch(ctx); err != nil {
			t.Fatal(err)
		}
		e, _ := b.ops.Get(ctx, 1)
		return e
	}
	for range 4 {
		if e := step(); e.Status != inbox.StatusOpen {
			t.Fatalf("parked before MaxAge: %+v", e)
		}
	}
	// Age the entry past MaxAge: the next attempt parks it.
	if _, err := b.pool.Exec(ctx, `UPDATE inbox SET received_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	if e := step(); e.Status != inbox.StatusParked || e.ParkReason != "NOT_WAITING" {
		t.Fatalf("want PARKED NOT_WAITING, got %+v", e)
	}
}

func TestReplay_TwiceHasOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.store.Ingest(ctx, []inbox.Message{msg("e1", "k", "p")}); err != nil {
		t.Fatal(err)
	}
	var applied int
	healed := false
	h := inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Entry) error {
		if !healed {
			return inbox.Park("AMBIGUOUS", errors.New("two waiting points"))
		}
		applied++
		return nil
	})
	r := b.relay(t, h, inbox.Config{})
	drain(t, r)
	auth := inbox.Authorization{Ticket: "INC-1", Actor: "alice"}
	dry, err := b.ops.Replay(ctx, inbox.ReplayRequest{Authorization: auth, IDs: []int64{1}, DryRun: true})
	if err != nil || len(dry.IDs) != 1 {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	if e, _ := b.ops.Get(ctx, 1); e.Status != inbox.StatusParked {
		t.Fatal("dry run changed the entry")
	}
	healed = true
	for range 2 {
		if _, err := b.ops.Replay(ctx, inbox.ReplayRequest{Authorization: auth, IDs: []int64{1}}); err != nil {
			t.Fatal(err)
		}
		drain(t, r)
	}
	if applied != 1 {
		t.Fatalf("applied %d times, want 1", applied)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox_audit WHERE action = 'inbox.replay' AND ticket = 'INC-1' AND actor = 'alice'`); n != 3 {
		t.Fatalf("audit rows = %d, want 3 (dry run + 2 replays)", n)
	}
}

func TestReplay_RefusesUnboundedRequests(t *testing.T) {
	t.Parallel()
	auth := inbox.Authorization{Ticket: "T", Actor: "a"}
	now := time.Now()
	for name, req := range map[string]inbox.ReplayRequest{
		"no ticket":      {Authorization: inbox.Authorization{Actor: "a"}, IDs: []int64{1}},
		"no actor":       {Authorization: inbox.Authorization{Ticket: "T"}, IDs: []int64{1}},
		"everything":     {Authorization: auth},
		"open range":     {Authorization: auth, From: now},
		"too long range": {Authorization: auth, From: now.Add(-30 * 24 * time.Hour), To: now},
		"both":           {Authorization: auth, IDs: []int64{1}, From: now.Add(-time.Hour), To: now},
		"too many ids":   {Authorization: auth, IDs: make([]int64, inbox.MaxReplayCount+1)},
	} {
		if err := req.Validate(); !errors.Is(err, inbox.ErrInvalidRequest) {
			t.Errorf("%s: want ErrInvalidRequest, got %v", name, err)
		}
	}
}

func TestOneLineSQLRepair_GoesThroughTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.store.Ingest(ctx, []inbox.Message{msg("e1", "k", "p")}); err != nil {
		t.Fatal(err)
	}
	healed := false
	h := inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Entry) error {
		if !healed {
			return inbox.Park("AMBIGUOUS", errors.New("two waiting points"))
		}
		return nil
	})
	r := b.relay(t, h, inbox.Config{})
	drain(t, r)
	healed = true
	// The one-line SQL repair, verbatim as in the runbook.
	if _, err := b.pool.Exec(ctx, `UPDATE inbox SET status = 'OPEN', attempts = 0, next_attempt_at = now() WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	drain(t, r)
	if e, _ := b.ops.Get(ctx, 1); e.Status != inbox.StatusApplied {
		t.Fatalf("after SQL repair: %+v", e)
	}
}

func TestCleanup_NeverDeletesParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var batch []inbox.Message
	for i := range 25 {
		batch = append(batch, msg(fmt.Sprintf("e%d", i), fmt.Sprintf("k%d", i), "p"))
	}
	if _, err := b.store.Ingest(ctx, batch); err != nil {
		t.Fatal(err)
	}
	h := inbox.HandlerFunc(func(_ context.Context, _ pgx.Tx, e *inbox.Entry) error {
		switch e.ID % 5 {
		case 0:
			return inbox.Park("AMBIGUOUS", errors.New("x"))
		case 1:
			return inbox.AlreadyApplied(errors.New("dup"))
		}
		return nil
	})
	drain(t, b.relay(t, h, inbox.Config{}))
	// Everything resolved "long ago", parked ones too.
	if _, err := b.pool.Exec(ctx, `UPDATE inbox SET processed_at = now() - interval '90 days', received_at = now() - interval '90 days', parked_at = now() - interval '90 days'`); err != nil {
		t.Fatal(err)
	}
	auth := inbox.Authorization{Ticket: "OPS-1", Actor: "bob"}
	if _, err := b.ops.Cleanup(ctx, inbox.CleanupRequest{Authorization: auth, Retention: time.Hour}); !errors.Is(err, inbox.ErrInvalidRequest) {
		t.Fatalf("retention below minimum must be refused, got %v", err)
	}
	n, err := b.ops.Cleanup(ctx, inbox.CleanupRequest{Authorization: auth, BatchSize: 3})
	if err != nil || n != 20 {
		t.Fatalf("deleted %d (%v), want 20", n, err)
	}
	if got := b.count(t, `SELECT count(*) FROM inbox WHERE status = 'PARKED'`); got != 5 {
		t.Fatalf("parked left = %d, want 5", got)
	}
	if got := b.count(t, `SELECT count(*) FROM inbox`); got != 5 {
		t.Fatalf("rows left = %d, want only the 5 parked", got)
	}
}

func TestMonitor_ReportsOldestOpenAndParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	p := msg("p1", "", "x")
	p.ParkReason, p.ParkError = inbox.ReasonPoison, "bad"
	if _, err := b.store.Ingest(ctx, []inbox.Message{msg("e1", "k", "p"), p}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE inbox SET received_at = now() - interval '10 minutes' WHERE event_id = 'e1'`); err != nil {
		t.Fatal(err)
	}
	mon, err := inbox.NewMonitor(b.pool, inbox.MonitorConfig{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := mon.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	s := mon.Snapshot()
	if s.OldestOpenAge < 9*time.Minute || s.Parked[inbox.ReasonPoison] != 1 || s.OpenEntries != 1 {
		t.Fatalf("snapshot %+v", s)
	}
}

// batchRecorder is a BatchHandler whose effect is a row in `effects`. fail
// names the entry whose batch fails; failAs says how (a returned error, or a
// technical per-entry result) — after the batch's other writes, which must
// then be rolled back.
type batchRecorder struct {
	fail     string
	failAs   string
	perEntry map[string]int // event id -> times Handle was called
}

func (h *batchRecorder) effect(ctx context.Context, tx pgx.Tx, e *inbox.Entry) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, e.EventID)
	return err
}

func (h *batchRecorder) Handle(ctx context.Context, tx pgx.Tx, e *inbox.Entry) error {
	if h.perEntry == nil {
		h.perEntry = map[string]int{}
	}
	h.perEntry[e.EventID]++
	if e.EventID == h.fail {
		return errors.New("connection reset")
	}
	return h.effect(ctx, tx, e)
}

func (h *batchRecorder) HandleBatch(ctx context.Context, tx pgx.Tx, es []*inbox.Entry) ([]error, error) {
	res := make([]error, len(es))
	for i, e := range es {
		switch {
		case e.EventID == h.fail && h.failAs == "result":
			res[i] = errors.New("connection reset")
		case e.EventID == h.fail:
			return nil, errors.New("connection reset")
		case e.EventID == "dup":
			res[i] = inbox.AlreadyApplied(errors.New("seen"))
		case e.EventID == "park":
			res[i] = inbox.Park("AMBIGUOUS", errors.New("two waiting points"))
		default:
			if err := h.effect(ctx, tx, e); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}

func (b bundle) effectsTable(t *testing.T) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `CREATE TABLE effects (event_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
}

func TestBatchHandler_CleanBatchNeedsNoPerEntryCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.effectsTable(t)
	if _, err := b.store.Ingest(context.Background(), []inbox.Message{msg("e1", "k1", "p"), msg("dup", "k2", "p"), msg("park", "k3", "p"), msg("e2", "k4", "p")}); err != nil {
		t.Fatal(err)
	}
	h := &batchRecorder{}
	drain(t, b.relay(t, h, inbox.Config{}))
	if len(h.perEntry) != 0 {
		t.Errorf("Handle called on a clean batch: %v", h.perEntry)
	}
	for id, want := range map[string]inbox.Status{"e1": inbox.StatusApplied, "e2": inbox.StatusApplied, "dup": inbox.StatusDuplicate, "park": inbox.StatusParked} {
		if n := b.count(t, `SELECT count(*) FROM inbox WHERE event_id = $1 AND status = $2 AND attempts = 1`, id, string(want)); n != 1 {
			t.Errorf("%s: not %s after one attempt", id, want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 2 {
		t.Fatalf("effects = %d, want 2", n)
	}
}

// A technical failure anywhere in a batch rolls the whole batch back; its
// entries are then applied one by one, so only the failing entry backs off.
func TestBatchHandler_TechnicalFailureFallsBackEntryByEntry(t *testing.T) {
	t.Parallel()
	for _, failAs := range []string{"error", "result"} {
		t.Run(failAs, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.effectsTable(t)
			if _, err := b.store.Ingest(context.Background(), []inbox.Message{msg("e1", "k1", "p"), msg("e2", "k2", "p"), msg("bad", "k3", "p"), msg("e3", "k4", "p")}); err != nil {
				t.Fatal(err)
			}
			h := &batchRecorder{fail: "bad", failAs: failAs}
			r := b.relay(t, h, inbox.Config{TechnicalBackoff: retry.Backoff{Base: time.Hour, Max: time.Hour}})
			if n, err := r.ProcessBatch(context.Background()); err != nil || n != 4 {
				t.Fatalf("ProcessBatch = %d, %v", n, err)
			}
			if n := b.count(t, `SELECT count(*) FROM inbox WHERE status = 'APPLIED' AND attempts = 1`); n != 3 {
				t.Fatalf("applied = %d, want 3", n)
			}
			if n := b.count(t, `SELECT count(*) FROM inbox WHERE event_id = 'bad' AND status = 'OPEN' AND attempts = 1 AND last_error LIKE '%connection reset%'`); n != 1 {
				t.Fatal("failing entry must back off OPEN with its error")
			}
			if len(h.perEntry) != 4 {
				t.Fatalf("entries re-applied one by one: %v, want all 4", h.perEntry)
			}
			// Every effect exactly once: the failed batch's writes were rolled back.
			if n := b.count(t, `SELECT count(*) FROM effects WHERE event_id IN ('e1', 'e2', 'e3')`); n != 3 {
				t.Fatalf("effects = %d, want 3", n)
			}
		})
	}
}

// A new entry wakes an idle relay through NOTIFY: with polling set to an
// hour, only the notification Ingest sends after its commit can explain a
// prompt apply.
func TestNotifyWakesAnIdleRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.effectsTable(t)
	r := b.relay(t, &batchRecorder{}, inbox.Config{PollInterval: time.Hour, SweepInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})

	// Let the relay find the empty inbox and go idle on its LISTEN
	// connection (the first LISTEN also wakes it once, see pgnotify).
	waitfor.Condition(t, 10*time.Second, "relay listening", func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`) >= 1
	})
	if _, err := b.store.Ingest(ctx, []inbox.Message{msg("woken", "k1", "p")}); err != nil {
		t.Fatal(err)
	}
	waitfor.Value(t, 10*time.Second, "entry applied after NOTIFY", 1, func() int {
		return b.count(t, `SELECT count(*) FROM effects WHERE event_id = 'woken'`)
	})
}
