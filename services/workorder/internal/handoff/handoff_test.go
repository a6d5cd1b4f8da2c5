package handoff_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const timeout = 10 * time.Second

// fakeProvider is a real gRPC ProviderService on loopback. answer decides
// each call's outcome (nil: accept); calls counts calls per work order.
type fakeProvider struct {
	providerv1.UnimplementedProviderServiceServer
	answer func(call int, req *providerv1.SubmitWorkOrderRequest) error

	mu    sync.Mutex
	calls map[string]int
}

func (p *fakeProvider) SubmitWorkOrder(_ context.Context, req *providerv1.SubmitWorkOrderRequest) (*providerv1.SubmitWorkOrderResponse, error) {
	p.mu.Lock()
	p.calls[req.GetWorkOrderId()]++
	n := p.calls[req.GetWorkOrderId()]
	p.mu.Unlock()
	if p.answer != nil {
		if err := p.answer(n, req); err != nil {
			return nil, err
		}
	}
	return &providerv1.SubmitWorkOrderResponse{
		Acceptance: &providerv1.Acceptance{JobId: "job-" + req.GetWorkOrderId()[:8], WorkOrderId: req.GetWorkOrderId()},
		Created:    n == 1,
	}, nil
}

func (p *fakeProvider) callsFor(id uuid.UUID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[id.String()]
}

type testBundle struct {
	pool       *pgxpool.Pool
	repo       *orders.Repository
	provider   *fakeProvider
	dispatcher *handoff.Dispatcher
}

func setup(t *testing.T, answer func(call int, req *providerv1.SubmitWorkOrderRequest) error) testBundle {
	t.Helper()
	return setupOn(t, pgtest.NewPool(t, migrations.WorkOrder()...), answer)
}

func setupOn(t *testing.T, pool *pgxpool.Pool, answer func(call int, req *providerv1.SubmitWorkOrderRequest) error) testBundle {
	t.Helper()
	repo, err := orders.NewRepository(pool)
	if err != nil {
		t.Fatal(err)
	}
	provider := &fakeProvider{answer: answer, calls: map[string]int{}}
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	providerv1.RegisterProviderServiceServer(srv, provider)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	completions, err := inbox.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := handoff.NewDispatcher(providerv1.NewProviderServiceClient(conn), repo, completions, handoff.Config{Deadline: 2 * time.Second}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return testBundle{pool: pool, repo: repo, provider: provider, dispatcher: d}
}

// runRelay runs a relay with fast polling and backoff until the test ends.
func (b testBundle) runRelay(t *testing.T, opts ...outbox.Option) {
	t.Helper()
	relay, err := outbox.NewRelay(b.pool, map[string]outbox.Dispatcher{handoff.EventType: b.dispatcher}, outbox.Config{
		PollInterval:  20 * time.Millisecond,
		SweepInterval: 20 * time.Millisecond,
		BackoffBase:   5 * time.Millisecond,
		BackoffMax:    20 * time.Millisecond,
	}, slog.New(slog.DiscardHandler), nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
}

func (b testBundle) createOrder(t *testing.T) uuid.UUID {
	t.Helper()
	o, err := orders.New("acme", "paint", 3, orders.Money{CurrencyCode: "EUR", MinorUnits: 100})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		_, err := orders.InTx(tx).Create(context.Background(), o)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return o.ID
}

func (b testBundle) event(t *testing.T, id uuid.UUID) outbox.Event {
	t.Helper()
	var ev outbox.Event
	if err := b.pool.QueryRow(context.Background(), `SELECT event_id, payload FROM outbox_events WHERE aggregate_id = $1`, id.String()).
		Scan(&ev.ID, &ev.Payload); err != nil {
		t.Fatal(err)
	}
	return ev
}

// eventStatus reads the order's hand-off event wherever it is: PENDING or
// FAILED in outbox, PUBLISHED once moved to outbox_published. attempts counts
// the recorded failures, plus the successful attempt once published.
func (b testBundle) eventStatus(t *testing.T, id uuid.UUID) (status string, attempts int) {
	t.Helper()
	if err := b.pool.QueryRow(context.Background(), `SELECT status, attempts FROM outbox_events WHERE aggregate_id = $1`, id.String()).
		Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	return status, attempts
}

func (b testBundle) waitingPoints(t *testing.T, id uuid.UUID) []string {
	t.Helper()
	rows, _ := b.pool.Query(context.Background(), `SELECT provider_job_id FROM waiting_points WHERE work_order_id = $1`, id)
	jobs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return jobs
}

func (b testBundle) order(t *testing.T, id uuid.UUID) orders.Order {
	t.Helper()
	o, err := b.repo.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func (b testBundle) waitEvent(t *testing.T, id uuid.UUID, want string) {
	t.Helper()
	waitfor.Value(t, timeout, "hand-off event status", want, func() string { s, _ := b.eventStatus(t, id); return s })
}

func TestHandOffEndToEnd(t *testing.T) {
	t.Parallel()
	handOffEndToEnd(t)
}

// The service's mode (app.go): the lease settlement sends its BEGIN and
// fence with the Commit's lock and its COMMIT after the save, in one
// transaction (pkg/outbox lease.go).
func TestHandOffEndToEnd_SlowDispatch(t *testing.T) {
	t.Parallel()
	handOffEndToEnd(t, outbox.WithSlowDispatch(handoff.EventType))
}

func handOffEndToEnd(t *testing.T, opts ...outbox.Option) {
	t.Helper()
	b := setup(t, nil)
	id := b.createOrder(t)
	b.runRelay(t, opts...)
	b.waitEvent(t, id, "PUBLISHED")

	if n := b.provider.callsFor(id); n != 1 {
		t.Fatalf("provider called %d times for the order, want 1", n)
	}
	// Delivered on the first attempt and moved out of the outbox.
	if _, attempts := b.eventStatus(t, id); attempts != 1 {
		t.Fatalf("attempts = %d, want 1", attempts)
	}
	var undelivered int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE aggregate_id = $1`, id.String()).Scan(&undelivered); err != nil || undelivered != 0 {
		t.Fatalf("undelivered outbox rows for the order: %d (%v), want 0", undelivered, err)
	}
	o := b.order(t, id)
	job := "job-" + id.String()[:8]
	if o.Status != orders.StatusHandedOff || o.ProviderJobID != job || o.Version != 2 {
		t.Fatalf("order: status %s job %q version %d", o.Status, o.ProviderJobID, o.Version)
	}
	if wp := b.waitingPoints(t, id); len(wp) != 1 || wp[0] != job {
		t.Fatalf("waiting points %v, want [%s]", wp, job)
	}
	h, err := b.repo.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 2 || h[1].From != orders.StatusCreated || h[1].To != orders.StatusHandedOff ||
		!strings.HasPrefix(h[1].Cause, orders.CauseHandOffAccepted+" job="+job) {
		t.Fatalf("history %+v", h)
	}
}

func TestProviderInvalidArgument_EventFailedOrderStaysCreated(t *testing.T) {
	t.Parallel()
	b := setup(t, func(int, *providerv1.SubmitWorkOrderRequest) error {
		return status.Error(codes.InvalidArgument, "positions exceed our capacity")
	})
	id := b.createOrder(t)
	b.runRelay(t)
	b.waitEvent(t, id, "FAILED")

	if _, attempts := b.eventStatus(t, id); attempts != 1 {
		t.Fatalf("attempts = %d, want 1 (permanent: no retry)", attempts)
	}
	if o := b.order(t, id); o.Status != orders.StatusCreated || o.ProviderJobID != "" {
		t.Fatalf("order %s job %q, want CREATED without job", o.Status, o.ProviderJobID)
	}
	if wp := b.waitingPoints(t, id); len(wp) != 0 {
		t.Fatalf("waiting points %v, want none", wp)
	}
}

func TestProviderUnavailableThenOK_RetriedThenHandedOff(t *testing.T) {
	t.Parallel()
	b := setup(t, func(call int, _ *providerv1.SubmitWorkOrderRequest) error {
		if call <= 2 {
			return status.Error(codes.Unavailable, "provider restarting")
		}
		return nil
	})
	id := b.createOrder(t)
	b.runRelay(t)
	b.waitEvent(t, id, "PUBLISHED")

	if n := b.provider.callsFor(id); n != 3 {
		t.Fatalf("provider called %d times, want 3", n)
	}
	if _, attempts := b.eventStatus(t, id); attempts != 1 {
		t.Fatalf("attempts = %d, want 1 (the provider's UNAVAILABLE is no attempt of the event's; the delivery is)", attempts)
	}
	if o := b.order(t, id); o.Status != orders.StatusHandedOff {
		t.Fatalf("order %s, want HANDED_OFF", o.Status)
	}
	if wp := b.waitingPoints(t, id); len(wp) != 1 {
		t.Fatalf("waiting points %v, want one", wp)
	}
}

func TestCancelledBeforeHandOff_ProviderIsNeverCalled(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	id := b.createOrder(t)
	if _, err := b.repo.Update(context.Background(), id, func(o *orders.Order) error { return o.Cancel("") }); err != nil {
		t.Fatal(err)
	}
	b.runRelay(t)
	// The event is done (nothing to deliver), not FAILED: a cancel is normal.
	b.waitEvent(t, id, "PUBLISHED")
	if n := b.provider.callsFor(id); n != 0 {
		t.Fatalf("provider called %d times for a cancelled order", n)
	}
	if o := b.order(t, id); o.Status != orders.StatusCancelled || o.ProviderJobID != "" {
		t.Fatalf("order %s job %q", o.Status, o.ProviderJobID)
	}
	if wp := b.waitingPoints(t, id); len(wp) != 0 {
		t.Fatalf("waiting points %v, want none", wp)
	}
}

// The cancel commits while the provider call is in flight: the cancel wins,
// the late acceptance is recorded in the history, no waiting point appears.
func TestCancelDuringHandOff_OrderStaysCancelledAndAcceptanceIsRecorded(t *testing.T) {
	t.Parallel()
	called, release := make(chan struct{}), make(chan struct{})
	b := setup(t, func(int, *providerv1.SubmitWorkOrderRequest) error {
		close(called)
		<-release
		return nil
	})
	id := b.createOrder(t)
	b.runRelay(t)
	select {
	case <-called:
	case <-time.After(timeout):
		t.Fatal("provider not called")
	}
	if _, err := b.repo.Update(context.Background(), id, func(o *orders.Order) error { return o.Cancel("too late?") }); err != nil {
		t.Fatalf("cancel during the provider call: %v", err)
	}
	close(release)
	b.waitEvent(t, id, "PUBLISHED")

	o := b.order(t, id)
	if o.Status != orders.StatusCancelled || o.ProviderJobID != "job-"+id.String()[:8] {
		t.Fatalf("order %s job %q, want CANCELLED with the job recorded", o.Status, o.ProviderJobID)
	}
	if wp := b.waitingPoints(t, id); len(wp) != 0 {
		t.Fatalf("waiting points %v, want none", wp)
	}
	h, err := b.repo.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	last := h[len(h)-1]
	if len(h) != 3 || last.From != orders.StatusCancelled || last.To != orders.StatusCancelled ||
		!strings.HasPrefix(last.Cause, orders.CauseHandOffAfterCancel) {
		t.Fatalf("history %+v", h)
	}
}

// F2 on the hand-off: the relay dies after the provider accepted, before its
// transaction recorded anything. Its claim dies with its session, so the
// event is still PENDING with no attempt counted; the next dispatch calls the
// provider again, which answers with the same job (idempotent by work order
// id), and the order is handed off once.
func TestF2_RelayDiesAfterProviderCall_NextDispatchHandsOffOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	id := b.createOrder(t)
	commit, err := b.dispatcher.Dispatch(context.Background(), b.event(t, id))
	if err != nil || commit == nil {
		t.Fatalf("first dispatch: commit %v err %v, want the acceptance", commit != nil, err)
	}
	// The dying relay never runs commit.
	if st, attempts := b.eventStatus(t, id); st != "PENDING" || attempts != 0 {
		t.Fatalf("after the crash the event is %s with %d attempts, want PENDING with 0", st, attempts)
	}
	b.runRelay(t)
	b.waitEvent(t, id, "PUBLISHED")
	if n := b.provider.callsFor(id); n != 2 {
		t.Fatalf("provider called %d times, want 2 (the crashed dispatch and its redelivery)", n)
	}
	if _, attempts := b.eventStatus(t, id); attempts != 1 {
		t.Fatalf("attempts = %d, want 1 (the crash recorded nothing)", attempts)
	}
	if wp := b.waitingPoints(t, id); len(wp) != 1 {
		t.Fatalf("waiting points %v, want one", wp)
	}
	if o := b.order(t, id); o.Status != orders.StatusHandedOff || o.Version != 2 {
		t.Fatalf("order %s version %d", o.Status, o.Version)
	}
}

// A dispatch of an event whose order is already HANDED_OFF (an operator
// requeued it, or the migration to outbox_published returned a PUBLISHING row
// to PENDING) changes nothing and adds no waiting point.
func TestF2_RepeatedAcceptanceAddsNoSecondWaitingPoint(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	id := b.createOrder(t)
	ctx := context.Background()
	ev := b.event(t, id)
	for range 2 {
		commit, err := b.dispatcher.Dispatch(ctx, ev)
		if err != nil {
			t.Fatal(err)
		}
		if commit == nil {
			// The second dispatch sees HANDED_OFF and skips the provider.
			continue
		}
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return commit(ctx, tx) }); err != nil {
			t.Fatal(err)
		}
		// Even a commit applied twice is harmless (the relay applies it once,
		// in the transaction that moves the event out of the outbox).
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return commit(ctx, tx) }); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.provider.callsFor(id); n != 1 {
		t.Fatalf("provider called %d times, want 1", n)
	}
	if wp := b.waitingPoints(t, id); len(wp) != 1 {
		t.Fatalf("waiting points %v, want one", wp)
	}
	if o := b.order(t, id); o.Status != orders.StatusHandedOff || o.Version != 2 {
		t.Fatalf("order %s version %d", o.Status, o.Version)
	}
}

// Graceful shutdown cancels the relay's context. A provider call already in
// flight is finished and its acceptance returned, so the relay records it;
// a dispatch that has not called the provider yet does not start.
func TestShutdownDuringProviderCall_CallCompletes(t *testing.T) {
	t.Parallel()
	called, release := make(chan struct{}), make(chan struct{})
	b := setup(t, func(int, *providerv1.SubmitWorkOrderRequest) error {
		close(called)
		<-release
		return nil
	})
	id := b.createOrder(t)
	ev := b.event(t, id)
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		commit outbox.Commit
		err    error
	}
	done := make(chan result, 1)
	go func() {
		c, err := b.dispatcher.Dispatch(ctx, ev)
		done <- result{c, err}
	}()
	<-called
	cancel()
	close(release)
	r := <-done
	if r.err != nil || r.commit == nil {
		t.Fatalf("dispatch cancelled mid-call: commit %v err %v, want the acceptance", r.commit != nil, r.err)
	}

	second := b.createOrder(t)
	if _, err := b.dispatcher.Dispatch(ctx, b.event(t, second)); !errors.Is(err, context.Canceled) || retry.IsPermanent(err) {
		t.Fatalf("dispatch after shutdown began: %v, want a transient context.Canceled", err)
	}
	if n := b.provider.callsFor(second); n != 0 {
		t.Fatalf("provider called %d times after shutdown began", n)
	}
}

func TestErrorClassification(t *testing.T) {
	t.Parallel()
	var answers sync.Map // work order id -> codes.Code
	b := setup(t, func(_ int, req *providerv1.SubmitWorkOrderRequest) error {
		code, _ := answers.Load(req.GetWorkOrderId())
		return status.Error(code.(codes.Code), "refused")
	})
	// Permanent: FAILED at once; unavailable: the provider's circuit, no
	// attempt charged; neither: transient, per-event backoff.
	type kind struct{ permanent, unavailable bool }
	for code, want := range map[codes.Code]kind{
		codes.InvalidArgument:    {permanent: true},
		codes.FailedPrecondition: {permanent: true},
		codes.OutOfRange:         {permanent: true},
		codes.Unimplemented:      {permanent: true},
		codes.AlreadyExists:      {permanent: true},
		codes.Unavailable:        {unavailable: true},
		codes.DeadlineExceeded:   {unavailable: true},
		codes.ResourceExhausted:  {},
		codes.Aborted:            {},
		codes.Internal:           {},
		codes.Unknown:            {},
		codes.Unauthenticated:    {},
		codes.PermissionDenied:   {},
		codes.NotFound:           {},
	} {
		id := b.createOrder(t)
		answers.Store(id.String(), code)
		commit, err := b.dispatcher.Dispatch(context.Background(), b.event(t, id))
		got := kind{retry.IsPermanent(err), outbox.IsUnavailable(err)}
		if err == nil || commit != nil || got != want || status.Code(err) != code {
			t.Errorf("%v: err %v (code %v), %+v want %+v", code, err, status.Code(err), got, want)
		}
	}
}

func TestMalformedEventIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	_, err := b.dispatcher.Dispatch(context.Background(), outbox.Event{ID: uuid.New(), Payload: []byte{0xff, 0xff}})
	if !retry.IsPermanent(err) {
		t.Fatalf("garbage payload: %v", err)
	}
}

// F5: a completion that overtook the hand-off sits deferred in the inbox.
// Recording the waiting point makes it due in the same transaction, so it
// does not wait out its backoff.
func TestF5_HandOffMakesDeferredCompletionsDue(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string][]outbox.Option{
		"lock claim": nil, "slow dispatch": {outbox.WithSlowDispatch(handoff.EventType)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			handOffMakesDeferredCompletionsDue(t, opts...)
		})
	}
}

func handOffMakesDeferredCompletionsDue(t *testing.T, opts ...outbox.Option) {
	t.Helper()
	b := setup(t, nil)
	id := b.createOrder(t)
	ctx := context.Background()
	msg := inbox.Message{Source: "provider", EventID: "early-1", EventType: "lossless.events.v1.WorkOrderCompleted",
		SchemaVersion: 1, CorrelationKey: id.String(), Payload: []byte("x")}
	store, err := inbox.NewStore(b.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Ingest(ctx, []inbox.Message{msg}); err != nil {
		t.Fatal(err)
	}
	// As the correlation relay leaves it after a NOT_WAITING attempt.
	if _, err := b.pool.Exec(ctx, `UPDATE inbox SET attempts = 1, next_attempt_at = now() + interval '1 hour' WHERE event_id = 'early-1'`); err != nil {
		t.Fatal(err)
	}
	b.runRelay(t, opts...)
	b.waitEvent(t, id, "PUBLISHED")
	var due bool
	if err := b.pool.QueryRow(ctx, `SELECT next_attempt_at <= now() FROM inbox WHERE event_id = 'early-1'`).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if !due {
		t.Fatal("the deferred completion still waits for its backoff after the hand-off committed")
	}
}

// The round trips of one hand-off, relay batch included, pinned: claim,
// journal, the pre-check read, the order's lock (with the relay's
// savepoint), its save with the statement making deferred completions due,
// and the settlement with the COMMIT. At a database's distance each is a
// network round trip of the order's handoff hop (B7).
func TestHandOffRoundTrips(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, migrations.WorkOrder()...)
	b := setupOn(t, pool, nil)
	relay, err := outbox.NewRelay(pool, map[string]outbox.Dispatcher{handoff.EventType: b.dispatcher}, outbox.Config{},
		slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for range 2 { // the first warms the statement caches
		id := b.createOrder(t)
		rt.Reset()
		if _, err := relay.ProcessBatch(context.Background()); err != nil {
			t.Fatal(err)
		}
		n = rt.Load()
		if s, _ := b.eventStatus(t, id); s != "PUBLISHED" {
			t.Fatalf("event %s, want PUBLISHED", s)
		}
		if o := b.order(t, id); o.Status != orders.StatusHandedOff {
			t.Fatalf("order %s, want HANDED_OFF", o.Status)
		}
		if wp := b.waitingPoints(t, id); len(wp) != 1 {
			t.Fatalf("waiting points %v, want one", wp)
		}
	}
	if n != 6 {
		t.Errorf("hand-off of one order: %d round trips, want 6", n)
	}
}
