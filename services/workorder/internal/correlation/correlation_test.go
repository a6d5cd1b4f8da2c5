package correlation_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/correlation"
)

// TestMain takes the test server from the environment (internal/testkit/benchkit):
// make bench runs the benchmarks with fsync on.
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

type bundle struct {
	pool    *pgxpool.Pool
	store   *inbox.Store
	ops     *inbox.Ops
	handler *correlation.Handler
}

func setup(t testing.TB) bundle {
	t.Helper()
	pool := pgtest.NewPool(t, migrations.WorkOrder()...)
	store, err := inbox.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ops, _ := inbox.NewOps(pool)
	return bundle{pool: pool, store: store, ops: ops, handler: correlation.NewHandler()}
}

// fastConfig keeps deferrals short so tests take milliseconds.
var fastConfig = inbox.Config{
	PollInterval: 2 * time.Millisecond, SweepInterval: time.Millisecond,
	MaxAttempts: 3, MaxAge: time.Nanosecond,
	DeferBackoff:     retry.Backoff{Base: time.Millisecond, Max: 2 * time.Millisecond},
	TechnicalBackoff: retry.Backoff{Base: time.Millisecond, Max: 2 * time.Millisecond},
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func (b bundle) relay(t *testing.T, cfg inbox.Config) *inbox.Relay {
	t.Helper()
	r, err := inbox.NewRelay(b.pool, b.handler, cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// run starts n relays until the test ends.
func (b bundle) run(t *testing.T, n int, cfg inbox.Config) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		r := b.relay(t, cfg)
		wg.Go(func() { _ = r.Run(ctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// order inserts a work order in status with waitingPoints open waiting points.
func (b bundle) order(t *testing.T, status string, positions, waitingPoints int) uuid.UUID {
	t.Helper()
	id := uuid.New()
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `INSERT INTO work_orders (id, customer_id, description, positions, currency_code, unit_price_minor, status)
		VALUES ($1, 'c-1', 'paint', $2, 'EUR', 250, $3)`, id, positions, status); err != nil {
		t.Fatal(err)
	}
	for range waitingPoints {
		b.addWaitingPoint(t, id)
	}
	return id
}

func (b bundle) addWaitingPoint(t *testing.T, id uuid.UUID) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO waiting_points (work_order_id, cause) VALUES ($1, 'test:handoff')`, id); err != nil {
		t.Fatal(err)
	}
}

func (b bundle) handOff(t *testing.T, id uuid.UUID) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(), `UPDATE work_orders SET status = 'HANDED_OFF' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	b.addWaitingPoint(t, id)
}

func completed(eventID string, order uuid.UUID, items int) inbox.Message {
	return message(eventID, order, &eventsv1.WorkOrderCompleted{EventId: eventID, WorkOrderId: order.String(), CompletedItems: int32(items)})
}

func started(eventID string, order uuid.UUID) inbox.Message {
	return message(eventID, order, &eventsv1.WorkOrderExecutionStarted{EventId: eventID, WorkOrderId: order.String()})
}

func message(eventID string, order uuid.UUID, m proto.Message) inbox.Message {
	data, _ := proto.Marshal(m)
	return inbox.Message{Source: correlation.Source, EventID: eventID, EventType: string(proto.MessageName(m)),
		SchemaVersion: 1, CorrelationKey: order.String(), Payload: data, Traceparent: traceparent}
}

func (b bundle) ingest(t *testing.T, ms ...inbox.Message) {
	t.Helper()
	if _, err := b.store.Ingest(context.Background(), ms); err != nil {
		t.Fatal(err)
	}
}

func (b bundle) entry(t *testing.T, eventID string) inbox.Entry {
	t.Helper()
	var id int64
	if err := b.pool.QueryRow(context.Background(), `SELECT id FROM inbox WHERE event_id = $1`, eventID).Scan(&id); err != nil {
		t.Fatalf("entry %s: %v", eventID, err)
	}
	e, err := b.ops.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (b bundle) waitStatus(t *testing.T, eventID string, want inbox.Status) inbox.Entry {
	t.Helper()
	var e inbox.Entry
	waitfor.Condition(t, 10*time.Second, eventID+" "+string(want), func() bool {
		e = b.entry(t, eventID)
		return e.Status == want
	})
	return e
}

type orderState struct {
	Status                 string
	Completed              int
	OpenWaitingPoints      int
	ConsumedBy             string
	CompletionOutboxEvents int
	OutboxTraceparent      string
}

func (b bundle) state(t *testing.T, id uuid.UUID) orderState {
	t.Helper()
	var s orderState
	err := b.pool.QueryRow(context.Background(), `
SELECT o.status, o.completed_items,
       (SELECT count(*) FROM waiting_points w WHERE w.work_order_id = o.id AND w.consumed_at IS NULL),
       coalesce((SELECT string_agg(consumed_by, ',') FROM waiting_points w WHERE w.work_order_id = o.id AND w.consumed_at IS NOT NULL), ''),
       (SELECT count(*) FROM outbox_events x WHERE x.aggregate_id = o.id::text AND x.event_type = 'lossless.events.v1.WorkOrderCompletionRecorded'),
       coalesce((SELECT x.headers->>'traceparent' FROM outbox_events x WHERE x.aggregate_id = o.id::text AND x.event_type = 'lossless.events.v1.WorkOrderCompletionRecorded' LIMIT 1), '')
FROM work_orders o WHERE o.id = $1`, id).Scan(&s.Status, &s.Completed, &s.OpenWaitingPoints, &s.ConsumedBy, &s.CompletionOutboxEvents, &s.OutboxTraceparent)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCompletion_AppliesAndAppendsOutboxEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.order(t, "HANDED_OFF", 10, 1)
	b.ingest(t, completed("c1", id, 10))
	b.run(t, 1, fastConfig)
	b.waitStatus(t, "c1", inbox.StatusApplied)
	got := b.state(t, id)
	want := orderState{Status: "COMPLETED", Completed: 10, ConsumedBy: "inbox:c1", CompletionOutboxEvents: 1, OutboxTraceparent: traceparent}
	if got != want {
		t.Fatalf("state %+v, want %+v", got, want)
	}
	var cause string
	if err := b.pool.QueryRow(context.Background(), `SELECT cause FROM work_order_transitions WHERE work_order_id = $1 AND to_status = 'COMPLETED'`, id).Scan(&cause); err != nil || cause != "inbox:c1" {
		t.Fatalf("transition cause %q (%v)", cause, err)
	}
}

func TestF5_CompletionBeforeHandOff_BacksOffThenApplies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.order(t, "CREATED", 5, 0)
	b.ingest(t, completed("c1", id, 5))
	cfg := fastConfig
	cfg.MaxAge = time.Hour // the deadline must not strike in this test
	b.run(t, 1, cfg)
	waitfor.Condition(t, 10*time.Second, "a few deferred attempts", func() bool { return b.entry(t, "c1").Attempts >= 2 })
	if e := b.entry(t, "c1"); e.Status != inbox.StatusOpen || e.LastError == "" {
		t.Fatalf("entry must back off OPEN with its error: %+v", e)
	}
	b.handOff(t, id)
	b.waitStatus(t, "c1", inbox.StatusApplied)
	if s := b.state(t, id); s.Status != "COMPLETED" || s.CompletionOutboxEvents != 1 {
		t.Fatalf("state %+v", s)
	}
}

func TestF5_ParkedAtDeadlineWhenHandOffNeverComes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.order(t, "CREATED", 5, 0)
	b.ingest(t, completed("c1", id, 5))
	b.run(t, 1, fastConfig)
	e := b.waitStatus(t, "c1", inbox.StatusParked)
	if e.ParkReason != correlation.ReasonNotWaiting || e.Attempts < fastConfig.MaxAttempts {
		t.Fatalf("entry %+v", e)
	}
}

func TestF6_RedeliveredAppliedEventIsDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.order(t, "HANDED_OFF", 10, 1)
	b.ingest(t, completed("c1", id, 10))
	b.run(t, 1, fastConfig)
	b.waitStatus(t, "c1", inbox.StatusApplied)
	// The inbox row is cleaned up after retention; the broker redelivers late.
	if _, err := b.pool.Exec(ctx, `DELETE FROM inbox WHERE event_id = 'c1'`); err != nil {
		t.Fatal(err)
	}
	b.ingest(t, completed("c1", id, 10))
	e := b.waitStatus(t, "c1", inbox.StatusDuplicate)
	if e.ParkReason != "" {
		t.Fatalf("a duplicate is not parked: %+v", e)
	}
	if s := b.state(t, id); s.Completed != 10 || s.CompletionOutboxEvents != 1 {
		t.Fatalf("duplicate had an effect: %+v", s)
	}
}

func TestF6_NewTrancheForCompletedOrderIsOverCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.order(t, "HANDED_OFF", 10, 1)
	b.ingest(t, completed("c1", id, 10), completed("c2", id, 3))
	b.run(t, 1, fastConfig)
	b.waitStatus(t, "c1", inbox.StatusApplied)
	e := b.waitStatus(t, "c2", inbox.StatusParked)
	if e.ParkReason != correlation.ReasonOverCompletion {
		t.Fatalf("entry %+v", e)
	}
	if s := b.state(t, id); s.Completed != 10 || s.CompletionOutboxEvents != 1 {
		t.Fatalf("state %+v", s)
	}
}

func TestF7_TwoWaitingPointsParkAsAmbiguous(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.order(t, "HANDED_OFF", 10, 2)
	b.ingest(t, completed("c1", id, 10))
	b.run(t, 1, fastConfig)
	e := b.waitStatus(t, "c1", inbox.StatusParked)
	if e.ParkReason != correlation.ReasonAmbiguous || e.Attempts != 1 {
		t.Fatalf("must park at once as AMBIGUOUS: %+v", e)
	}
	if s := b.state(t, id); s.Status != "HANDED_OFF" || s.Completed != 0 || s.OpenWaitingPoints != 2 {
		t.Fatalf("ambiguous correlation changed the order: %+v", s)
	}
	// Repair: remove the extra waiting point, then replay.
	if _, err := b.pool.Exec(context.Background(), `UPDATE waiting_points SET consumed_at = now(), consumed_by = 'operator:INC-7'
		WHERE id = (SELECT max(id) FROM waiting_points WHERE work_order_id = $1)`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ops.Replay(context.Background(), inbox.ReplayRequest{Authorization: inbox.Authorization{Ticket: "INC-7", Actor: "alice"}, IDs: []int64{e.ID}}); err != nil {
		t.Fatal(err)
	}
	b.waitStatus(t, "c1", inbox.StatusApplied)
	if s := b.state(t, id); s.Status != "COMPLETED" {
		t.Fatalf("after repair: %+v", s)
	}
}

func TestF8_UnknownOrderParkedAtDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.ingest(t, completed("c1", uuid.New(), 1))
	b.run(t, 1, fastConfig)
	e := b.waitStatus(t, "c1", inbox.StatusParked)
	if e.ParkReason != correlation.ReasonUnknownOrder || e.Attempts < fastConfig.MaxAttempts {
		t.Fatalf("entry %+v", e)
	}
}

func TestF9_PoisonPayloadReplayedIsParkedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := completed("c1", uuid.New(), 1)
	m.Payload = []byte{0xff, 0xff, 0xff}
	b.ingest(t, m)
	b.run(t, 1, fastConfig)
	e := b.waitStatus(t, "c1", inbox.StatusParked)
	if e.ParkReason != inbox.ReasonPoison || e.Attempts != 1 {
		t.Fatalf("entry %+v", e)
	}
}

func TestF11_TwoEventTypesOfOneOrderThreeRelaysKeepOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const orders = 40
	ids := make([]uuid.UUID, orders)
	var batch []inbox.Message
	for i := range ids {
		ids[i] = b.order(t, "HANDED_OFF", 4, 1)
		batch = append(batch, started(fmt.Sprintf("s%d", i), ids[i]))
	}
	for i := range ids {
		batch = append(batch, completed(fmt.Sprintf("c%d-1", i), ids[i], 2), completed(fmt.Sprintf("c%d-2", i), ids[i], 2))
	}
	b.ingest(t, batch...)
	cfg := fastConfig
	cfg.BatchSize = 5
	b.run(t, 3, cfg)
	waitfor.Condition(t, 20*time.Second, "all applied", func() bool {
		var open int
		_ = b.pool.QueryRow(context.Background(), `SELECT count(*) FROM inbox WHERE status <> 'APPLIED'`).Scan(&open)
		return open == 0
	})
	for i, id := range ids {
		rows, _ := b.pool.Query(context.Background(), `SELECT cause FROM work_order_transitions WHERE work_order_id = $1 ORDER BY id`, id)
		causes, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("[inbox:s%d:execution-started inbox:c%d-1:tranche 2/4 inbox:c%d-2]", i, i, i)
		if fmt.Sprint(causes) != want {
			t.Fatalf("order %d history %v, want %s", i, causes, want)
		}
	}
}

func TestF14_SplitCompletionBothTranchesRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.order(t, "HANDED_OFF", 10, 1)
	b.ingest(t, completed("c1", id, 4), completed("c2", id, 6))
	b.run(t, 1, fastConfig)
	b.waitStatus(t, "c2", inbox.StatusApplied)
	if e := b.entry(t, "c1"); e.Status != inbox.StatusApplied {
		t.Fatalf("first tranche: %+v", e)
	}
	if s := b.state(t, id); s.Status != "COMPLETED" || s.Completed != 10 || s.ConsumedBy != "inbox:c2" || s.CompletionOutboxEvents != 1 {
		t.Fatalf("state %+v", s)
	}
}

// The fourth rejection ("the waiting point vanished between query and
// delivery") cannot happen: two correlations of one order, run at the same
// time outside the relay's per-key guard, serialize on the order's row lock;
// exactly one consumes the waiting point, the other sees a completed order.
func TestConcurrentRelaysCannotBothConsumeOneWaitingPoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for round := range 20 {
		id := b.order(t, "HANDED_OFF", 5, 1)
		entries := []*inbox.Entry{}
		for _, ev := range []string{"a", "b"} {
			m := completed(fmt.Sprintf("r%d-%s", round, ev), id, 5)
			entries = append(entries, &inbox.Entry{ID: int64(round*2 + len(entries)), Source: m.Source, EventID: m.EventID,
				EventType: m.EventType, SchemaVersion: 1, CorrelationKey: m.CorrelationKey, Payload: m.Payload})
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, e := range entries {
			wg.Go(func() {
				errs[i] = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.handler.Handle(ctx, tx, e) })
			})
		}
		wg.Wait()
		var over *correlation.OverCompletionError
		ok, rejected := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case errors.As(err, &over):
				rejected++
			default:
				t.Fatalf("unexpected error: %v", err)
			}
		}
		if ok != 1 || rejected != 1 {
			t.Fatalf("round %d: %d applied, %d rejected; want exactly one each", round, ok, rejected)
		}
		var consumed int
		_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM waiting_points WHERE work_order_id = $1 AND consumed_at IS NOT NULL`, id).Scan(&consumed)
		if s := b.state(t, id); consumed != 1 || s.CompletionOutboxEvents != 1 || s.Completed != 5 {
			t.Fatalf("round %d: consumed %d, state %+v", round, consumed, s)
		}
	}
}

func TestClassification_ErrorTypes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err    error
		disp   inbox.Disposition
		reason string
	}{
		{&correlation.NotWaitingError{}, inbox.Deferred, correlation.ReasonNotWaiting},
		{&correlation.UnknownOrderError{}, inbox.Deferred, correlation.ReasonUnknownOrder},
		{&correlation.AlreadyAppliedError{}, inbox.Duplicate, "DUPLICATE"},
		{&correlation.AmbiguousError{}, inbox.Parked, correlation.ReasonAmbiguous},
		{&correlation.OverCompletionError{}, inbox.Parked, correlation.ReasonOverCompletion},
		{&correlation.OrderCancelledError{}, inbox.Parked, correlation.ReasonOrderCancelled},
		{fmt.Errorf("lock: %w", errors.New("conn reset")), inbox.Technical, ""},
	} {
		d, r := inbox.Classify(fmt.Errorf("wrapped: %w", c.err))
		if d != c.disp || r != c.reason {
			t.Errorf("%T: got %v %q, want %v %q", c.err, d, r, c.disp, c.reason)
		}
	}
}

// entryOf turns a message into the entry the relay would pass (not stored).
func entryOf(id int64, m inbox.Message) *inbox.Entry {
	return &inbox.Entry{ID: id, Source: m.Source, EventID: m.EventID, EventType: m.EventType,
		SchemaVersion: m.SchemaVersion, CorrelationKey: m.CorrelationKey, Payload: m.Payload, Traceparent: m.Traceparent}
}

// One batch holding every outcome: the accepted entries write their effects
// with set-based statements, the rejected ones write nothing, and two
// tranches of one order in the same batch apply one after the other.
func TestHandleBatch_EveryOutcomeInOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ok := b.order(t, "HANDED_OFF", 3, 1)
	split := b.order(t, "HANDED_OFF", 4, 1)
	started1 := b.order(t, "HANDED_OFF", 2, 1)
	created := b.order(t, "CREATED", 2, 0)
	ambiguous := b.order(t, "HANDED_OFF", 2, 2)
	over := b.order(t, "HANDED_OFF", 2, 1)
	cancelled := b.order(t, "CANCELLED", 2, 0)
	dup := b.order(t, "HANDED_OFF", 2, 1)
	if _, err := b.pool.Exec(ctx, `INSERT INTO work_order_applied_events (source, event_id, work_order_id, event_type)
		VALUES ($1, 'dup', $2, $3)`, correlation.Source, dup, correlation.TypeCompleted); err != nil {
		t.Fatal(err)
	}
	poison := completed("poison", uuid.New(), 1)
	poison.Payload = []byte{0xff}
	msgs := []inbox.Message{
		completed("ok", ok, 3), completed("split-1", split, 1), started("started", started1),
		completed("created", created, 2), completed("unknown", uuid.New(), 1), completed("ambiguous", ambiguous, 2),
		completed("over", over, 3), completed("cancelled", cancelled, 1), completed("dup", dup, 2), poison,
		completed("split-2", split, 3),
	}
	es := make([]*inbox.Entry, len(msgs))
	for i, m := range msgs {
		es[i] = entryOf(int64(i+1), m)
	}
	var results []error
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		results, err = b.handler.HandleBatch(ctx, tx, es)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		disp   inbox.Disposition
		reason string
	}{
		{-1, ""}, {-1, ""}, {-1, ""},
		{inbox.Deferred, correlation.ReasonNotWaiting}, {inbox.Deferred, correlation.ReasonUnknownOrder},
		{inbox.Parked, correlation.ReasonAmbiguous}, {inbox.Parked, correlation.ReasonOverCompletion},
		{inbox.Parked, correlation.ReasonOrderCancelled}, {inbox.Duplicate, "DUPLICATE"}, {inbox.Parked, inbox.ReasonPoison},
		{-1, ""},
	}
	for i, w := range want {
		if w.disp == -1 {
			if results[i] != nil {
				t.Errorf("%s: %v, want applied", msgs[i].EventID, results[i])
			}
			continue
		}
		if d, r := inbox.Classify(results[i]); results[i] == nil || d != w.disp || r != w.reason {
			t.Errorf("%s: %v (%v %q), want %v %q", msgs[i].EventID, results[i], d, r, w.disp, w.reason)
		}
	}
	if s := b.state(t, ok); s.Status != "COMPLETED" || s.Completed != 3 || s.ConsumedBy != "inbox:ok" || s.CompletionOutboxEvents != 1 || s.OutboxTraceparent != traceparent {
		t.Errorf("ok: %+v", s)
	}
	if s := b.state(t, split); s.Status != "COMPLETED" || s.Completed != 4 || s.ConsumedBy != "inbox:split-2" || s.CompletionOutboxEvents != 1 {
		t.Errorf("split: %+v", s)
	}
	rows, _ := b.pool.Query(ctx, `SELECT cause FROM work_order_transitions WHERE work_order_id = $1 ORDER BY id`, split)
	if causes, err := pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || fmt.Sprint(causes) != "[inbox:split-1:tranche 1/4 inbox:split-2]" {
		t.Errorf("split history %v (%v)", causes, err)
	}
	if s := b.state(t, started1); s.Status != "HANDED_OFF" || s.OpenWaitingPoints != 1 {
		t.Errorf("started: %+v", s)
	}
	// Rejected entries wrote nothing: no applied-event row, no history, no change.
	var applied, history int
	_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM work_order_applied_events`).Scan(&applied)
	_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM work_order_transitions`).Scan(&history)
	if applied != 5 || history != 4 { // ok, split-1, split-2, started (+ the seeded dup); history: the same 4
		t.Errorf("applied events %d (want 5), transitions %d (want 4)", applied, history)
	}
	for _, id := range []uuid.UUID{created, ambiguous, over, dup} {
		if s := b.state(t, id); s.Completed != 0 || s.CompletionOutboxEvents != 0 {
			t.Errorf("rejected order %s changed: %+v", id, s)
		}
	}
}

// A batch mixing an applicable completion and one that must wait (F5): the
// first is applied, the second backs off, in the same relay transaction.
func TestRelay_MixedBatchAppliesAndDefers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ready := b.order(t, "HANDED_OFF", 1, 1)
	early := b.order(t, "CREATED", 1, 0)
	b.ingest(t, completed("early", early, 1), completed("ready", ready, 1))
	cfg := fastConfig
	cfg.MaxAge = time.Hour
	cfg.DeferBackoff = retry.Backoff{Base: time.Hour, Max: time.Hour}
	r := b.relay(t, cfg)
	if n, err := r.ProcessBatch(context.Background()); err != nil || n != 2 {
		t.Fatalf("ProcessBatch = %d, %v", n, err)
	}
	if e := b.entry(t, "ready"); e.Status != inbox.StatusApplied {
		t.Fatalf("ready: %+v", e)
	}
	if e := b.entry(t, "early"); e.Status != inbox.StatusOpen || e.Attempts != 1 || e.LastError == "" {
		t.Fatalf("early: %+v", e)
	}
	if s := b.state(t, early); s.Status != "CREATED" || s.Completed != 0 {
		t.Fatalf("early order changed: %+v", s)
	}
}
