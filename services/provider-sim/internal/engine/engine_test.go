package engine_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/faults"
)

func TestSubmitIsIdempotent_TenConcurrentSubmissionsCreateOneJob(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	e := b.newEngine(t, testConfig())
	for rep := range 20 {
		order := engine.Order{WorkOrderID: uuid.New(), CustomerID: "c-1", Description: "paint", Positions: 3}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			created int
			jobs    = map[uuid.UUID]bool{}
		)
		for range 10 {
			wg.Go(func() {
				acc, c, err := e.Submit(context.Background(), order)
				if err != nil {
					t.Errorf("rep %d: submit: %v", rep, err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				jobs[acc.JobID] = true
				if c {
					created++
				}
			})
		}
		wg.Wait()
		var rows int
		if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE work_order_id = $1`, order.WorkOrderID).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if rows != 1 || created != 1 || len(jobs) != 1 {
			t.Fatalf("rep %d: rows=%d created=%d distinct job ids=%d, want 1/1/1", rep, rows, created, len(jobs))
		}
	}
}

func TestSubmitWithSameIDButDifferentContentIsAConflict(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	e := b.newEngine(t, testConfig())
	order := engine.Order{WorkOrderID: uuid.New(), CustomerID: "c-1", Description: "paint", Positions: 3}
	first, _, err := e.Submit(context.Background(), order)
	if err != nil {
		t.Fatal(err)
	}
	again, created, err := e.Submit(context.Background(), order)
	if err != nil || created || again != first {
		t.Fatalf("repeat: %+v created=%v err=%v, want the original acceptance %+v", again, created, err, first)
	}
	order.Positions = 4
	if _, _, err := e.Submit(context.Background(), order); !errors.Is(err, engine.ErrConflict) {
		t.Fatalf("err = %v, want ErrConflict", err)
	}
}

func TestExecutionPublishesStartedThenCompletedWithStableIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	e := b.newEngine(t, testConfig())
	start(t, e)
	acc := b.submit(t, e, 7)
	key := acc.WorkOrderID.String()

	var ms []msg
	waitfor.Condition(t, 30*time.Second, "completion published", func() bool {
		ms = b.obs.all(t)
		return len(of(ms, typeCompleted, key)) == 1
	})
	waitfor.Value(t, 30*time.Second, "job done", "DONE", func() string { return b.jobStatus(t, acc.JobID) })
	if len(ms) != 2 || ms[0].EventType != typeStarted || ms[1].EventType != typeCompleted {
		t.Fatalf("messages = %+v, want STARTED then COMPLETED", ms)
	}
	var started eventsv1.WorkOrderExecutionStarted
	if err := proto.Unmarshal(ms[0].Data, &started); err != nil || started.GetEventId() != ms[0].EventID ||
		started.GetWorkOrderId() != key || ms[0].OrderingKey != key {
		t.Fatalf("started = %v (err %v), attributes %+v", &started, err, ms[0])
	}
	done := ms[1].completed(t)
	if done.GetEventId() != ms[1].EventID || done.GetWorkOrderId() != key || done.GetCompletedItems() != 7 ||
		done.GetCompletedAt() == nil || ms[1].OrderingKey != key {
		t.Fatalf("completed = %v, attributes %+v", done, ms[1])
	}
	var unpublished int
	if err := b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM job_events WHERE job_id = $1 AND published_at IS NULL`, acc.JobID).Scan(&unpublished); err != nil || unpublished != 0 {
		t.Fatalf("unpublished events = %d (err %v)", unpublished, err)
	}
}

func TestF4_DuplicatePublishesTheSameEventIDTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, options{rates: faults.Rates{Duplicate: 1}})
	e := b.newEngine(t, testConfig())
	start(t, e)
	acc := b.submit(t, e, 5)
	key := acc.WorkOrderID.String()

	var done []msg
	waitfor.Condition(t, 30*time.Second, "both copies published", func() bool {
		done = of(b.obs.all(t), typeCompleted, key)
		return len(done) == 2
	})
	waitfor.Value(t, 30*time.Second, "job done", "DONE", func() string { return b.jobStatus(t, acc.JobID) })
	if done[0].EventID != done[1].EventID || string(done[0].Data) != string(done[1].Data) {
		t.Fatalf("copies differ: %s vs %s", done[0].EventID, done[1].EventID)
	}
	if got := done[0].completed(t).GetCompletedItems(); got != 5 {
		t.Fatalf("items = %d, want 5", got)
	}
	if n := len(of(b.obs.all(t), typeStarted, key)); n != 1 {
		t.Fatalf("started published %d times, want 1 (only completions are duplicated)", n)
	}
}

func TestF14_SplitCompletionIsTwoEventsWhoseItemsSumToPositions(t *testing.T) {
	t.Parallel()
	b := setup(t, options{rates: faults.Rates{SplitCompletion: 1}})
	e := b.newEngine(t, testConfig())
	start(t, e)
	for _, positions := range []int32{2, 10, 1000} {
		acc := b.submit(t, e, positions)
		var done []msg
		waitfor.Condition(t, 30*time.Second, "two tranches published", func() bool {
			done = of(b.obs.all(t), typeCompleted, acc.WorkOrderID.String())
			return len(done) == 2
		})
		first, second := done[0].completed(t), done[1].completed(t)
		if done[0].EventID == done[1].EventID || first.GetEventId() == second.GetEventId() {
			t.Fatalf("positions %d: tranches share event id %s", positions, done[0].EventID)
		}
		if first.GetCompletedItems() < 1 || second.GetCompletedItems() < 1 ||
			first.GetCompletedItems()+second.GetCompletedItems() != positions {
			t.Fatalf("positions %d: tranches %d + %d", positions, first.GetCompletedItems(), second.GetCompletedItems())
		}
	}
	// One position cannot be split: one event carries it.
	acc := b.submit(t, e, 1)
	waitfor.Value(t, 30*time.Second, "job done", "DONE", func() string { return b.jobStatus(t, acc.JobID) })
	if done := of(b.obs.all(t), typeCompleted, acc.WorkOrderID.String()); len(done) != 1 || done[0].completed(t).GetCompletedItems() != 1 {
		t.Fatalf("single-position job: %d completions", len(done))
	}
}

func TestF5_EarlyCompletionIsPublishedBeforeSubmitReturns(t *testing.T) {
	t.Parallel()
	b := setup(t, options{rates: faults.Rates{EarlyCompletion: 1}})
	// No engine workers run: only Submit itself can publish.
	e := b.newEngine(t, testConfig())
	acc := b.submit(t, e, 4)
	returned := time.Now()
	key := acc.WorkOrderID.String()

	// Checked without waiting: the emulator already holds the message when
	// Submit returns, and stamped it before that moment.
	var stored bool
	for _, m := range b.emu.Server.Messages() {
		if m.OrderingKey == key && m.Attributes[pubsub.AttrEventType] == typeCompleted {
			stored = true
			if m.PublishTime.After(returned) {
				t.Fatalf("published at %v, after Submit returned at %v", m.PublishTime, returned)
			}
		}
	}
	if !stored {
		t.Fatal("completion not on the topic when Submit returned")
	}
	var done []msg
	waitfor.Condition(t, 30*time.Second, "observer receives the completion", func() bool {
		done = of(b.obs.all(t), typeCompleted, key)
		return len(done) == 1
	})
	if got := done[0].completed(t).GetCompletedItems(); got != 4 {
		t.Fatalf("items = %d, want 4", got)
	}
	if s := b.jobStatus(t, acc.JobID); s != "DONE" {
		t.Fatalf("job status %s, want DONE", s)
	}
}

func TestF9_PoisonMessageFailsToParseOrFailsValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, options{rates: faults.Rates{Poison: 1, Seed: 7}})
	e := b.newEngine(t, testConfig())
	start(t, e)
	kinds := map[string]int{}
	for range 12 {
		acc := b.submit(t, e, 3)
		key := acc.WorkOrderID.String()
		var ms []msg
		waitfor.Condition(t, 30*time.Second, "poison and completion published", func() bool {
			ms = firstCopies(of(b.obs.all(t), typeCompleted, key))
			return len(ms) == 2
		})
		var kind string
		if err := b.pool.QueryRow(context.Background(), `SELECT fault_poison FROM jobs WHERE job_id = $1`, acc.JobID).Scan(&kind); err != nil {
			t.Fatal(err)
		}
		kinds[kind]++
		// The poison comes first; the real completion still follows.
		poison, real := ms[0], ms[1]
		if poison.EventID == real.EventID {
			t.Fatal("poison reuses the completion's event id")
		}
		var ev eventsv1.WorkOrderCompleted
		err := proto.Unmarshal(poison.Data, &ev)
		switch faults.Poison(kind) {
		case faults.PoisonUnparseable:
			if err == nil {
				t.Fatalf("unparseable poison parsed: %v", &ev)
			}
		case faults.PoisonMissingWorkOrderID, faults.PoisonNegativeItems:
			if err != nil {
				t.Fatalf("%s poison does not parse: %v", kind, err)
			}
			if validCompletion(&ev) {
				t.Fatalf("%s poison passes validation: %v", kind, &ev)
			}
		default:
			t.Fatalf("job has poison kind %q", kind)
		}
		if c := real.completed(t); !validCompletion(c) || c.GetCompletedItems() != 3 {
			t.Fatalf("real completion invalid: %v", c)
		}
	}
	if len(kinds) != 3 {
		t.Fatalf("poison kinds drawn = %v, want all three with seed 7", kinds)
	}
}

// validCompletion is the schema a consumer enforces beyond parsing.
func validCompletion(ev *eventsv1.WorkOrderCompleted) bool {
	_, err := uuid.Parse(ev.GetWorkOrderId())
	return err == nil && ev.GetEventId() != "" && ev.GetCompletedItems() >= 1 && ev.GetCompletedAt() != nil
}

func TestF8_UnknownOrderCompletionNamesAnOrderWithoutAJob(t *testing.T) {
	t.Parallel()
	b := setup(t, options{rates: faults.Rates{UnknownOrder: 1}})
	e := b.newEngine(t, testConfig())
	start(t, e)
	acc := b.submit(t, e, 6)
	waitfor.Value(t, 30*time.Second, "job done", "DONE", func() string { return b.jobStatus(t, acc.JobID) })

	var unknown []*eventsv1.WorkOrderCompleted
	for _, m := range of(b.obs.all(t), typeCompleted, "") {
		if m.OrderingKey != acc.WorkOrderID.String() {
			ev := m.completed(t)
			if ev.GetWorkOrderId() != m.OrderingKey {
				t.Fatalf("ordering key %s != work order id %s", m.OrderingKey, ev.GetWorkOrderId())
			}
			unknown = append(unknown, ev)
		}
	}
	if len(unknown) != 1 {
		t.Fatalf("unknown-order completions = %d, want 1", len(unknown))
	}
	var jobs int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE work_order_id = $1`,
		unknown[0].GetWorkOrderId()).Scan(&jobs); err != nil || jobs != 0 {
		t.Fatalf("jobs for the unknown order = %d (err %v), want 0", jobs, err)
	}
	if real := of(b.obs.all(t), typeCompleted, acc.WorkOrderID.String()); len(real) != 1 {
		t.Fatalf("real completions = %d, want 1", len(real))
	}
}

func TestF2_PublishThenCrashRepublishesTheSameEventIDAfterRestart(t *testing.T) {
	t.Parallel()
	b := setup(t, options{rates: faults.Rates{PublishThenCrash: 1}})
	crashed := make(chan struct{})
	cfg := testConfig()
	var first *running
	cfg.Crash = func() {
		// What os.Exit does to the process: no more work from this engine.
		first.cancel()
		close(crashed)
	}
	e1 := b.newEngine(t, cfg)
	first = start(t, e1)
	acc := b.submit(t, e1, 3)
	key := acc.WorkOrderID.String()
	<-crashed
	first.stop()

	var done []msg
	waitfor.Condition(t, 30*time.Second, "completion published before the crash", func() bool {
		done = of(b.obs.all(t), typeCompleted, key)
		return len(done) == 1
	})
	var recorded bool
	if err := b.pool.QueryRow(context.Background(),
		`SELECT published_at IS NOT NULL FROM job_events WHERE event_id = $1`, done[0].EventID).Scan(&recorded); err != nil || recorded {
		t.Fatalf("publish recorded = %v (err %v), want false: the crash came first", recorded, err)
	}

	// The restarted process: a new engine (new owner) on the same database
	// takes the job over once the dead owner's lease expires.
	cfg2 := testConfig()
	start(t, b.newEngine(t, cfg2))
	waitfor.Value(t, 30*time.Second, "job done after restart", "DONE", func() string { return b.jobStatus(t, acc.JobID) })
	done = of(b.obs.all(t), typeCompleted, key)
	if len(done) != 2 || done[0].EventID != done[1].EventID || string(done[0].Data) != string(done[1].Data) {
		t.Fatalf("completions after restart = %+v, want the same event published twice", done)
	}
	if n := len(of(b.obs.all(t), typeStarted, key)); n != 1 {
		t.Fatalf("started published %d times, want 1 (it was recorded before the crash)", n)
	}
}

func TestRestartInTheMiddleOfExecutionStillCompletesTheJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	cfg := testConfig()
	cfg.ExecBase = 400 * time.Millisecond
	first := start(t, b.newEngine(t, cfg))
	acc := b.submit(t, b.newEngine(t, cfg), 2)
	key := acc.WorkOrderID.String()
	// Mid-run: the started event is out, the completion is not.
	waitfor.Condition(t, 30*time.Second, "execution started and announced", func() bool {
		return len(of(b.obs.all(t), typeStarted, key)) == 1
	})

	first.stop() // graceful: the in-flight job is released, not completed
	var owner *string
	if err := b.pool.QueryRow(context.Background(), `SELECT lease_owner FROM jobs WHERE job_id = $1`, acc.JobID).Scan(&owner); err != nil || owner != nil {
		t.Fatalf("lease owner after shutdown = %v (err %v), want released", owner, err)
	}
	// The release recorded the publish: the next owner must not repeat it.
	var recorded bool
	if err := b.pool.QueryRow(context.Background(), `SELECT published_at IS NOT NULL FROM job_events
		WHERE job_id = $1 AND kind = 'STARTED'`, acc.JobID).Scan(&recorded); err != nil || !recorded {
		t.Fatalf("started recorded as published after the release = %v (err %v), want true", recorded, err)
	}
	if s := b.jobStatus(t, acc.JobID); s != "EXECUTING" {
		t.Fatalf("status after shutdown = %s, want EXECUTING", s)
	}

	start(t, b.newEngine(t, cfg))
	waitfor.Value(t, 30*time.Second, "job done after restart", "DONE", func() string { return b.jobStatus(t, acc.JobID) })
	ms := b.obs.all(t)
	if c, s := of(ms, typeCompleted, key), of(ms, typeStarted, key); len(c) != 1 || len(s) != 1 {
		t.Fatalf("completed %d, started %d times; want once each", len(c), len(s))
	}
}

func TestTwoInstancesShareTheWorkAndPublishEachJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	// A lease no heartbeat can miss on a loaded machine: this test is about
	// sharing work, not takeover (an expired lease may publish a job twice,
	// with the same event id, by design; takeover has its own tests).
	cfg := testConfig()
	cfg.Lease = 10 * time.Second
	e1, e2 := b.newEngine(t, cfg), b.newEngine(t, cfg)
	start(t, e1)
	start(t, e2)
	const n = 40
	accs := make([]engine.Acceptance, 0, n)
	for i := range n {
		accs = append(accs, b.submit(t, []*engine.Engine{e1, e2}[i%2], 2))
	}
	waitfor.Condition(t, 10*time.Second, "every job completed", func() bool {
		return len(of(b.obs.all(t), typeCompleted, "")) >= n
	})
	waitfor.Condition(t, 30*time.Second, "every job done", func() bool {
		var done int
		_ = b.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE status = 'DONE'`).Scan(&done)
		return done == n
	})
	per := map[string]int{}
	for _, m := range of(b.obs.all(t), typeCompleted, "") {
		per[m.OrderingKey]++
	}
	for _, a := range accs {
		if per[a.WorkOrderID.String()] != 1 {
			t.Fatalf("order %s completed %d times", a.WorkOrderID, per[a.WorkOrderID.String()])
		}
	}
}

func TestF16_PubSubUnavailableRetriesWithTheSameEventID(t *testing.T) {
	t.Parallel()
	b := setup(t, options{timeout: 100 * time.Millisecond})
	cfg := testConfig()
	cfg.Retry.Base, cfg.Retry.Max = 20*time.Millisecond, 50*time.Millisecond
	start(t, b.newEngine(t, cfg))
	b.outage.on.Store(true)
	e := b.newEngine(t, cfg)
	acc := b.submit(t, e, 2)
	waitfor.Condition(t, 30*time.Second, "failed attempts recorded", func() bool {
		var attempts int
		_ = b.pool.QueryRow(context.Background(), `SELECT attempts FROM jobs WHERE job_id = $1`, acc.JobID).Scan(&attempts)
		return attempts >= 2
	})
	b.outage.on.Store(false)
	waitfor.Value(t, 30*time.Second, "job done after the outage", "DONE", func() string { return b.jobStatus(t, acc.JobID) })
	ms := b.obs.all(t)
	key := acc.WorkOrderID.String()
	if c, s := of(ms, typeCompleted, key), of(ms, typeStarted, key); len(c) != 1 || len(s) != 1 {
		t.Fatalf("completed %d, started %d; want each once", len(c), len(s))
	}
}
