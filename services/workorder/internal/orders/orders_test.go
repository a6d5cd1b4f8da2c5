package orders_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func newOrder(t *testing.T) orders.Order {
	t.Helper()
	o, err := orders.New("acme", "paint", 2, orders.Money{CurrencyCode: "EUR", MinorUnits: 500})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestCancelRules(t *testing.T) {
	t.Parallel()
	o := newOrder(t)
	if err := o.Cancel("changed plans"); err != nil || o.Status != orders.StatusCancelled {
		t.Fatalf("cancel CREATED: %v %s", err, o.Status)
	}
	if err := o.Cancel(""); err != nil || o.Status != orders.StatusCancelled {
		t.Fatalf("cancel CANCELLED again: %v %s", err, o.Status)
	}
	for _, s := range []orders.Status{orders.StatusHandedOff, orders.StatusCompleted, orders.StatusInvoiced} {
		o := newOrder(t)
		o.Status = s
		var stateErr *orders.IllegalTransitionError
		if err := o.Cancel(""); !errors.As(err, &stateErr) || o.Status != s {
			t.Errorf("cancel %s: %v, status now %s", s, err, o.Status)
		}
	}
}

func TestAcceptHandOffOutcomes(t *testing.T) {
	t.Parallel()
	o := newOrder(t)
	if got := o.AcceptHandOff("job-1", "ev-1"); got != orders.HandedOff || o.Status != orders.StatusHandedOff || o.ProviderJobID != "job-1" {
		t.Fatalf("CREATED: %v %s %q", got, o.Status, o.ProviderJobID)
	}
	if got := o.AcceptHandOff("job-2", "ev-1"); got != orders.AlreadyHandedOff || o.ProviderJobID != "job-1" {
		t.Fatalf("HANDED_OFF again: %v %q", got, o.ProviderJobID)
	}
	c := newOrder(t)
	_ = c.Cancel("")
	if got := c.AcceptHandOff("job-3", "ev-2"); got != orders.AcceptedAfterCancel || c.Status != orders.StatusCancelled || c.ProviderJobID != "job-3" {
		t.Fatalf("CANCELLED: %v %s %q", got, c.Status, c.ProviderJobID)
	}
}

func setup(t *testing.T) (*pgxpool.Pool, *orders.Repository) {
	t.Helper()
	pool := pgtest.NewPool(t, migrations.WorkOrder()...)
	repo, err := orders.NewRepository(pool)
	if err != nil {
		t.Fatal(err)
	}
	return pool, repo
}

func count(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// F3 / I1 at the repository: a create whose transaction rolls back leaves
// neither the order nor its event nor its transition.
func TestF3_RolledBackCreateLeavesNoOrderAndNoEvent(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t)
	ctx := context.Background()
	rollback := errors.New("later step of the business transaction failed")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := orders.InTx(tx).Create(ctx, newOrder(t)); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}
	for _, table := range []string{"work_orders", "work_order_transitions", "outbox_events"} {
		if n := count(t, pool, table); n != 0 {
			t.Errorf("%s = %d after rollback, want 0", table, n)
		}
	}
	// And a committed one has all three.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := orders.InTx(tx).Create(ctx, newOrder(t)); return err }); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"work_orders", "work_order_transitions", "outbox_events"} {
		if n := count(t, pool, table); n != 1 {
			t.Errorf("%s = %d after commit, want 1", table, n)
		}
	}
}

// Orders created in one transaction share created_at; the id breaks the tie
// so that pages neither skip nor repeat an order.
func TestListKeysetWithEqualCreationTimes(t *testing.T) {
	t.Parallel()
	pool, repo := setup(t)
	ctx := context.Background()
	var want []uuid.UUID
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for range 5 {
			o, err := orders.InTx(tx).Create(ctx, newOrder(t))
			if err != nil {
				return err
			}
			want = append(want, o.ID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(want, func(a, b uuid.UUID) int { return -slices.Compare(a[:], b[:]) })

	var got []uuid.UUID
	var after *orders.Cursor
	for {
		page, next, err := repo.List(ctx, orders.ListQuery{After: after, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page {
			got = append(got, o.ID)
		}
		if next == nil {
			break
		}
		after = next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages %v, want %v", got, want)
	}
}

func TestUpdateUnknownOrderIsNotFound(t *testing.T) {
	t.Parallel()
	_, repo := setup(t)
	_, err := repo.Update(context.Background(), uuid.New(), func(o *orders.Order) error { return o.Cancel("") })
	if !errors.Is(err, orders.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
}

// Concurrent cancels of one order: one transition, whoever wins.
func TestConcurrentCancelsRecordOneTransition(t *testing.T) {
	t.Parallel()
	pool, repo := setup(t)
	ctx := context.Background()
	for range 20 {
		var o orders.Order
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			o, err = orders.InTx(tx).Create(ctx, newOrder(t))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 4)
		for range 4 {
			go func() {
				_, err := repo.Update(ctx, o.ID, func(o *orders.Order) error { return o.Cancel("") })
				errs <- err
			}()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		h, err := repo.History(ctx, o.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != 2 {
			t.Fatalf("history has %d entries, want 2 (create, one cancel)", len(h))
		}
	}
}
