package orders_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

const testScope = "/test/Create"

// createHandler responds with the stored order's id and status.
func createHandler(t *testing.T, pool *pgxpool.Pool) *orders.CreateHandler[*wrapperspb.StringValue] {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	keys, err := idempotency.NewStore(pool, idempotency.Config{}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := orders.NewCreateHandler(pool, keys, testScope, func(o orders.Order) *wrapperspb.StringValue {
		return wrapperspb.String(o.ID.String() + " " + string(o.Status))
	}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestCommandHandlersRefuseNilDependencies(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t)
	logger := slog.New(slog.DiscardHandler)
	keys, err := idempotency.NewStore(pool, idempotency.Config{}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	respond := func(orders.Order) *wrapperspb.StringValue { return nil }
	for name, build := range map[string]func() error{
		"db": func() error {
			_, err := orders.NewCreateHandler(nil, keys, testScope, respond, logger, nil)
			return err
		},
		"keys": func() error {
			_, err := orders.NewCreateHandler(pool, nil, testScope, respond, logger, nil)
			return err
		},
		"scope": func() error { _, err := orders.NewCreateHandler(pool, keys, "", respond, logger, nil); return err },
		"respond": func() error {
			_, err := orders.NewCreateHandler[*wrapperspb.StringValue](pool, keys, testScope, nil, logger, nil)
			return err
		},
		"logger": func() error { _, err := orders.NewCreateHandler(pool, keys, testScope, respond, nil, nil); return err },
		"cancel db": func() error {
			_, err := orders.NewCancelHandler(nil, logger, nil)
			return err
		},
		"cancel logger": func() error { _, err := orders.NewCancelHandler(pool, nil, nil); return err },
	} {
		if build() == nil {
			t.Errorf("nil %s accepted", name)
		}
	}
}

// The create commits the order, its transition and its hand-off event, and
// wakes the outbox relay after the commit: woken, the relay finds the event.
func TestCreateHandlerStoresTheOrderAndWakesTheRelayAfterTheCommit(t *testing.T) {
	t.Parallel()
	pool, repo := setup(t)
	ctx := context.Background()
	h := createHandler(t, pool)

	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, `LISTEN "public.outbox"`); err != nil {
		t.Fatal(err)
	}

	o := newOrder(t)
	resp, replayed, err := h.Handle(ctx, orders.CreateOrder{Order: o})
	if err != nil || replayed {
		t.Fatalf("create: %v, replayed %v", err, replayed)
	}
	if want := o.ID.String() + " CREATED"; resp.GetValue() != want {
		t.Fatalf("response %q, want %q", resp.GetValue(), want)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := conn.WaitForNotification(wctx); err != nil {
		t.Fatalf("no wake-up of the outbox relay: %v", err)
	}
	if n := count(t, pool, "outbox"); n != 1 {
		t.Fatalf("%d outbox events when the relay was woken, want 1", n)
	}
	stored, err := repo.Get(ctx, o.ID)
	if err != nil || stored.Status != orders.StatusCreated {
		t.Fatalf("stored order: %+v, %v", stored, err)
	}
	if n := count(t, pool, "work_order_transitions"); n != 1 {
		t.Fatalf("%d transitions, want 1", n)
	}
}

func TestCreateHandlerReplaysAKeyAndRefusesItForAnotherRequest(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t)
	ctx := context.Background()
	h := createHandler(t, pool)
	key := uuid.NewString()

	first, replayed, err := h.Handle(ctx, orders.CreateOrder{Order: newOrder(t), IdempotencyKey: key, Request: wrapperspb.String("a")})
	if err != nil || replayed {
		t.Fatalf("first create: %v, replayed %v", err, replayed)
	}
	again, replayed, err := h.Handle(ctx, orders.CreateOrder{Order: newOrder(t), IdempotencyKey: key, Request: wrapperspb.String("a")})
	if err != nil || !replayed || again.GetValue() != first.GetValue() {
		t.Fatalf("retry: %q replayed %v, %v; want %q replayed", again.GetValue(), replayed, err, first.GetValue())
	}
	_, _, err = h.Handle(ctx, orders.CreateOrder{Order: newOrder(t), IdempotencyKey: key, Request: wrapperspb.String("b")})
	if !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("same key, another request: %v, want ErrMismatch", err)
	}
	if _, _, err := h.Handle(ctx, orders.CreateOrder{Order: newOrder(t), IdempotencyKey: uuid.NewString()}); err == nil {
		t.Fatal("a key without its request was accepted")
	}
	if n := count(t, pool, "work_orders"); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	if n := count(t, pool, "outbox"); n != 1 {
		t.Fatalf("%d outbox events, want 1", n)
	}
}

// A create that fails (here: an order not fresh from New) stores nothing,
// neither the order nor the key.
func TestCreateHandlerFailureStoresNothing(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t)
	h := createHandler(t, pool)
	o := newOrder(t)
	o.Status = orders.StatusHandedOff
	if _, _, err := h.Handle(context.Background(), orders.CreateOrder{Order: o, IdempotencyKey: uuid.NewString(), Request: wrapperspb.String("a")}); err == nil {
		t.Fatal("create of a non-fresh order succeeded")
	}
	for _, table := range []string{"work_orders", "outbox", "idempotency_keys"} {
		if n := count(t, pool, table); n != 0 {
			t.Errorf("%d rows in %s, want 0", n, table)
		}
	}
}

func TestCancelHandlerCancelsOnceAndRefusesAfterHandOff(t *testing.T) {
	t.Parallel()
	pool, repo := setup(t)
	ctx := context.Background()
	h, err := orders.NewCancelHandler(pool, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	id := createOrder(t, pool, repo, 2)
	for range 2 { // a second cancel returns the order unchanged
		o, err := h.Handle(ctx, orders.CancelOrder{ID: id, Reason: "changed plans"})
		if err != nil || o.Status != orders.StatusCancelled {
			t.Fatalf("cancel: %+v, %v", o, err)
		}
	}
	history, err := repo.History(ctx, id)
	if err != nil || len(history) != 2 {
		t.Fatalf("history %+v, %v: want creation and one cancel", history, err)
	}

	handedOff := createOrder(t, pool, repo, 2)
	if _, err := repo.Update(ctx, handedOff, handOff); err != nil {
		t.Fatal(err)
	}
	var illegal *orders.IllegalTransitionError
	if _, err := h.Handle(ctx, orders.CancelOrder{ID: handedOff}); !errors.As(err, &illegal) {
		t.Fatalf("cancel after hand-off: %v, want an IllegalTransitionError", err)
	}
	if o, err := repo.Get(ctx, handedOff); err != nil || o.Status != orders.StatusHandedOff {
		t.Fatalf("order after the refused cancel: %+v, %v", o, err)
	}
	if _, err := h.Handle(ctx, orders.CancelOrder{ID: uuid.New()}); !errors.Is(err, orders.ErrNotFound) {
		t.Fatalf("cancel of an unknown order: %v, want ErrNotFound", err)
	}
}

// A create with an idempotency key costs seven round trips: BEGIN, the
// key's lock and claim, the order with its first transition, the hand-off
// event, the stored response, COMMIT, and the relay's wake-up after it.
// Nine before (the lock and the transition were statements of their own).
func TestRoundTripsOfACreate(t *testing.T) {
	t.Parallel()
	pool, rt := pgtest.NewCountingPool(t, migrations.WorkOrder()...)
	repo, err := orders.NewRepository(pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h := createHandler(t, pool)
	create := func() orders.Order {
		t.Helper()
		o := newOrder(t)
		if _, replayed, err := h.Handle(ctx, orders.CreateOrder{Order: o, IdempotencyKey: o.ID.String(),
			Request: wrapperspb.String(o.ID.String())}); err != nil || replayed {
			t.Fatalf("create: %v, replayed %v", err, replayed)
		}
		return o
	}
	create() // the statement cache
	rt.Reset()
	o := create()
	if n := rt.Load(); n != 3 {
		t.Errorf("round trips %d, want 3", n)
	}
	history, err := repo.History(ctx, o.ID)
	if err != nil || len(history) != 1 || history[0].From != "" || history[0].To != orders.StatusCreated || history[0].Cause != orders.CauseCreate {
		t.Fatalf("history %+v, %v: want the one creation", history, err)
	}
	if n := count(t, pool, "outbox"); n != 2 {
		t.Fatalf("%d outbox events, want one per order", n)
	}
	stored, err := repo.Get(ctx, o.ID)
	if err != nil || stored.Version != 1 || stored.CreatedAt.IsZero() || !stored.UpdatedAt.Equal(stored.CreatedAt) {
		t.Fatalf("stored %+v, %v: want version 1, created = updated", stored, err)
	}

	// Without a key, and a replay: three round trips each.
	rt.Reset()
	if _, _, err := h.Handle(ctx, orders.CreateOrder{Order: newOrder(t)}); err != nil {
		t.Fatal(err)
	}
	if n := rt.Load(); n != 3 {
		t.Errorf("round trips of a create without a key %d, want 3", n)
	}
	rt.Reset()
	if _, replayed, err := h.Handle(ctx, orders.CreateOrder{Order: newOrder(t), IdempotencyKey: o.ID.String(),
		Request: wrapperspb.String(o.ID.String())}); err != nil || !replayed {
		t.Fatalf("replay: %v, replayed %v", err, replayed)
	}
	if n := rt.Load(); n != 3 {
		t.Errorf("round trips of a replay %d, want 3", n)
	}
	if n := count(t, pool, "work_orders"); n != 3 {
		t.Fatalf("%d orders, want 3 (the replay creates none)", n)
	}
}

// A create builds its response and its event from the transaction's
// timestamp before its insert: a schema whose timestamps are no longer the
// transaction's makes the create fail whole, not store a response or an
// event that disagrees with the row.
func TestCreateRefusesTimestampsThatAreNotTheTransactions(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, migrations.WorkOrder()...)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `ALTER TABLE work_orders ALTER created_at SET DEFAULT clock_timestamp()`); err != nil {
		t.Fatal(err)
	}
	o := newOrder(t)
	_, _, err := createHandler(t, pool).Handle(ctx, orders.CreateOrder{Order: o, IdempotencyKey: o.ID.String(),
		Request: wrapperspb.String(o.ID.String())})
	if err == nil || !strings.Contains(err.Error(), "want 1 at the transaction's") {
		t.Fatalf("create: %v, want the mismatch named", err)
	}
	for _, table := range []string{"work_orders", "outbox", "idempotency_keys"} {
		if n := count(t, pool, table); n != 0 {
			t.Errorf("%d rows in %s after the failed create, want 0", n, table)
		}
	}
}
