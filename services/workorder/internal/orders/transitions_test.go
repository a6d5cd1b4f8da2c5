package orders_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// row is what a transition must have written, read back with plain SQL.
type row struct {
	status            string
	version           int64
	completed         int32
	jobID, invoiceID  string
	history           int
	lastFrom, lastTo  string
	lastCause         string
	open, consumed    int
	lastConsumedCause string
}

func readRow(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) row {
	t.Helper()
	ctx := context.Background()
	var r row
	if err := pool.QueryRow(ctx, `
SELECT w.status, w.version, w.completed_items, coalesce(w.provider_job_id, ''), coalesce(w.invoice_id::text, ''),
       (SELECT count(*) FROM work_order_transitions WHERE work_order_id = w.id),
       (SELECT count(*) FROM waiting_points WHERE work_order_id = w.id AND consumed_at IS NULL),
       (SELECT count(*) FROM waiting_points WHERE work_order_id = w.id AND consumed_at IS NOT NULL),
       coalesce((SELECT consumed_by FROM waiting_points WHERE work_order_id = w.id AND consumed_at IS NOT NULL
                 ORDER BY id DESC LIMIT 1), '')
FROM work_orders w WHERE w.id = $1`, id).Scan(&r.status, &r.version, &r.completed, &r.jobID, &r.invoiceID,
		&r.history, &r.open, &r.consumed, &r.lastConsumedCause); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `
SELECT coalesce(from_status, ''), to_status, cause FROM work_order_transitions
WHERE work_order_id = $1 ORDER BY id DESC LIMIT 1`, id).Scan(&r.lastFrom, &r.lastTo, &r.lastCause); err != nil {
		t.Fatal(err)
	}
	return r
}

func createOrder(t *testing.T, pool *pgxpool.Pool, repo *orders.Repository, positions int32) uuid.UUID {
	t.Helper()
	o, err := orders.New("acme", "paint", positions, orders.Money{CurrencyCode: "EUR", MinorUnits: 500})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := orders.InTx(tx).Create(context.Background(), o)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return o.ID
}

func handOff(o *orders.Order) error { o.AcceptHandOff("job-1", "ev-1"); return nil }
func cancel(o *orders.Order) error  { return o.Cancel("plans changed") }
func tranche1(o *orders.Order) error {
	_, err := o.Complete(1, "inbox:t1")
	return err
}
func completeN(o *orders.Order) error {
	_, err := o.Complete(2, "inbox:c1")
	return err
}
func started(o *orders.Order) error   { return o.RecordExecutionStarted("inbox:s1:execution-started") }
func reHandOff(o *orders.Order) error { return o.ReHandOff("operator:re-hand-off:T-1") }
func invoice(o *orders.Order) error {
	_, err := o.Invoice(uuid.MustParse(invoiceID), "billing:INV-1")
	return err
}

const invoiceID = "0b9cd9a4-4c8f-4b8e-9d3b-2f7c7c1d0e11"

// Each transition of the lifecycle table through Repository.Update (Lock,
// the Order method, Save in one transaction) on PostgreSQL: the row's
// status and fields, its version, the history row, the waiting points.
func TestTransitionsThroughRepository(t *testing.T) {
	t.Parallel()
	pool, repo := setup(t)
	cases := []struct {
		name      string
		positions int32
		before    []func(*orders.Order) error
		apply     func(*orders.Order) error
		want      row // history counts the creation transition
	}{
		{"hand-off accepted", 2, nil, handOff, row{status: "HANDED_OFF", version: 2, jobID: "job-1", history: 2,
			lastFrom: "CREATED", lastTo: "HANDED_OFF", lastCause: orders.CauseHandOffAccepted + " job=job-1 event=ev-1", open: 1}},
		{"cancelled", 2, nil, cancel, row{status: "CANCELLED", version: 2, history: 2,
			lastFrom: "CREATED", lastTo: "CANCELLED", lastCause: "api:cancel: plans changed"}},
		{"hand-off accepted after cancel", 2, []func(*orders.Order) error{cancel}, handOff, row{status: "CANCELLED", version: 3,
			jobID: "job-1", history: 3, lastFrom: "CANCELLED", lastTo: "CANCELLED",
			lastCause: orders.CauseHandOffAfterCancel + " job=job-1 event=ev-1"}},
		{"execution started", 2, []func(*orders.Order) error{handOff},
			started,
			row{status: "HANDED_OFF", version: 2, jobID: "job-1", history: 3,
				lastFrom: "HANDED_OFF", lastTo: "HANDED_OFF", lastCause: "inbox:s1:execution-started", open: 1}},
		{"completion tranche", 2, []func(*orders.Order) error{handOff}, tranche1, row{status: "HANDED_OFF", version: 3,
			completed: 1, jobID: "job-1", history: 3, lastFrom: "HANDED_OFF", lastTo: "HANDED_OFF", lastCause: "inbox:t1:tranche 1/2", open: 1}},
		{"completed", 2, []func(*orders.Order) error{handOff}, completeN, row{status: "COMPLETED", version: 3,
			completed: 2, jobID: "job-1", history: 3, lastFrom: "HANDED_OFF", lastTo: "COMPLETED", lastCause: "inbox:c1",
			consumed: 1, lastConsumedCause: "inbox:c1"}},
		{"completed by the last of two tranches", 3, []func(*orders.Order) error{handOff, tranche1}, completeN,
			row{status: "COMPLETED", version: 4, completed: 3, jobID: "job-1", history: 4,
				lastFrom: "HANDED_OFF", lastTo: "COMPLETED", lastCause: "inbox:c1", consumed: 1, lastConsumedCause: "inbox:c1"}},
		{"re-hand-off", 2, []func(*orders.Order) error{handOff},
			reHandOff,
			row{status: "HANDED_OFF", version: 2, jobID: "job-1", history: 3,
				lastFrom: "HANDED_OFF", lastTo: "HANDED_OFF", lastCause: "operator:re-hand-off:T-1", open: 2}},
		{"invoiced", 2, []func(*orders.Order) error{handOff, completeN}, invoice, row{status: "INVOICED", version: 4,
			completed: 2, jobID: "job-1", invoiceID: invoiceID, history: 4, lastFrom: "COMPLETED", lastTo: "INVOICED",
			lastCause: "billing:INV-1", consumed: 1, lastConsumedCause: "inbox:c1"}},
	}
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := createOrder(t, pool, repo, c.positions)
			for _, fn := range c.before {
				if _, err := repo.Update(ctx, id, fn); err != nil {
					t.Fatal(err)
				}
			}
			o, err := repo.Update(ctx, id, c.apply)
			if err != nil {
				t.Fatal(err)
			}
			got := readRow(t, pool, id)
			if got != c.want {
				t.Fatalf("row\n got %+v\nwant %+v", got, c.want)
			}
			// The returned order is the stored one.
			if string(o.Status) != got.status || o.Version != got.version || len(o.OpenWaitingPoints()) != got.open {
				t.Fatalf("returned order %+v differs from the row %+v", o, got)
			}
		})
	}
}

// A refused transition writes nothing: not the row, not the history, not a
// waiting point.
func TestIllegalTransitionThroughRepositoryWritesNothing(t *testing.T) {
	t.Parallel()
	pool, repo := setup(t)
	ctx := context.Background()
	id := createOrder(t, pool, repo, 2)
	before := readRow(t, pool, id)
	for _, fn := range []func(*orders.Order) error{
		invoice, completeN, reHandOff, started,
	} {
		_, err := repo.Update(ctx, id, fn)
		var illegal *orders.IllegalTransitionError
		if !errors.As(err, &illegal) || illegal.From != orders.StatusCreated {
			t.Fatalf("err = %v, want IllegalTransitionError from CREATED", err)
		}
	}
	if after := readRow(t, pool, id); after != before {
		t.Fatalf("refused transitions wrote: before %+v, after %+v", before, after)
	}
}

// Save writes several orders' transitions with one statement per table:
// the correlation applies a batch of completions in the inbox relay's
// transaction this way, with the zero Repository.
func TestSaveManyOrdersInCallersTransaction(t *testing.T) {
	t.Parallel()
	pool, repo := setup(t)
	ctx := context.Background()
	a, b := createOrder(t, pool, repo, 2), createOrder(t, pool, repo, 2)
	for _, id := range []uuid.UUID{a, b} {
		if _, err := repo.Update(ctx, id, handOff); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		txRepo := orders.InTx(tx)
		oa, err := txRepo.Lock(ctx, a)
		if err != nil {
			return err
		}
		ob, err := txRepo.Lock(ctx, b)
		if err != nil {
			return err
		}
		if err := completeN(&oa); err != nil {
			return err
		}
		if err := tranche1(&ob); err != nil {
			return err
		}
		return txRepo.Save(ctx, &oa, &ob)
	}); err != nil {
		t.Fatal(err)
	}
	if got := readRow(t, pool, a); got.status != "COMPLETED" || got.consumed != 1 || got.lastTo != "COMPLETED" {
		t.Errorf("order a: %+v", got)
	}
	if got := readRow(t, pool, b); got.status != "HANDED_OFF" || got.completed != 1 || got.open != 1 || got.lastCause != "inbox:t1:tranche 1/2" {
		t.Errorf("order b: %+v", got)
	}
	// The zero TxRepository has no transaction: its methods refuse, and a
	// Repository needs a handle.
	var zero orders.TxRepository
	if _, err := zero.Lock(ctx, a); err == nil {
		t.Error("Lock on the zero TxRepository succeeded")
	}
	if err := zero.Save(ctx); err == nil {
		t.Error("Save on the zero TxRepository succeeded")
	}
	if _, err := zero.Create(ctx, newOrder(t)); err == nil {
		t.Error("Create on the zero TxRepository succeeded")
	}
	if _, err := orders.NewRepository(nil); err == nil {
		t.Error("NewRepository(nil) succeeded")
	}
}
