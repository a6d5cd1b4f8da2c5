package leasequeue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/leasequeue"
)

// TestModelTrailLeaseNoFence replays model/trails/lease-no-fence.txt, the
// shortest counterexample Spin finds in model/lease.pml once the epoch is
// dropped from the completion's fence (MUTANT_NO_FENCE): a worker whose lease
// expired and was taken over completes the job, and its invoice is the one
// visible. Through the real queue, the same steps end with the stale
// completion refused (ErrLeaseLost), one invoice per order, and the job done
// under the successor's epoch.
func TestModelTrailLeaseNoFence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := b.queue(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE trail_invoices (work_order text NOT NULL, epoch bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// invoice is the job's effect; no unique key on purpose: a second invoice
	// for an order would show as a second row.
	invoice := func(job leasequeue.Job) leasequeue.Complete {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO trail_invoices (work_order, epoch) VALUES ($1, $2)`, job.UniqueKey, job.Epoch)
			return err
		}
	}
	// The model's two jobs: one invoice job per work order.
	if n, err := q.Enqueue(ctx, b.pool,
		leasequeue.NewJob{UniqueKey: "order-1", MaxAttempts: 5},
		leasequeue.NewJob{UniqueKey: "order-2", MaxAttempts: 5}); err != nil || n != 2 {
		t.Fatalf("enqueue: %d, %v", n, err)
	}

	// 1. Worker A claims the job: epoch 1.
	a, err := q.Claim(ctx, "worker-a", 1, 0)
	if err != nil || len(a) != 1 || a[0].Epoch != 1 {
		t.Fatalf("step 1, A claims: %+v, %v; want one job at epoch 1", a, err)
	}
	order := a[0].UniqueKey

	// 2. The lease of the job (epoch 1) expires: A stalls past it.
	b.clock.Advance(lease + time.Millisecond)

	// 3. Worker B claims the job (the rescue): epoch 2.
	bj, err := q.ClaimExpired(ctx, "worker-b", 10)
	if err != nil || len(bj) != 1 || bj[0].ID != a[0].ID || bj[0].Epoch != 2 {
		t.Fatalf("step 3, B claims: %+v, %v; want A's job at epoch 2", bj, err)
	}

	// 4. Worker A completes the job with epoch 1. Without the fence this is
	// the invoice the model finds visible; the queue refuses it.
	if err := q.Complete(ctx, a[0], invoice(a[0])); !errors.Is(err, leasequeue.ErrLeaseLost) {
		t.Fatalf("step 4, A completes with a stale epoch: %v; want ErrLeaseLost", err)
	}
	if n := b.count(t, `SELECT count(*) FROM trail_invoices`); n != 0 {
		t.Fatalf("step 4: %d invoices after the stale completion; want none", n)
	}

	// The rest of the run: B completes its claim.
	if err := q.Complete(ctx, bj[0], invoice(bj[0])); err != nil {
		t.Fatalf("B completes with the current epoch: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM trail_invoices WHERE work_order = $1`, order); n != 1 {
		t.Fatalf("%d invoices for %s; want exactly one", n, order)
	}
	if n := b.count(t, `SELECT count(*) FROM trail_invoices WHERE work_order = $1 AND epoch = 2`, order); n != 1 {
		t.Fatalf("the invoice of %s is not B's (epoch 2)", order)
	}
	if n := b.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE id = $1 AND state = 'done' AND epoch = 2`, a[0].ID); n != 1 {
		t.Fatalf("job %d is not done under B's epoch 2", a[0].ID)
	}
	if got := b.counter(t, "leasequeue.lease.fenced"); got != 1 {
		t.Fatalf("fenced counter = %d; want 1 (A's completion)", got)
	}
}
