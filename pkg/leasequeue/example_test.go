package leasequeue_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// A job is enqueued in the business transaction; a worker runs it and its
// effect (an invoice row) commits in the same transaction as the fenced
// "done" mark, so it exists once, whatever crashes or takeovers happen.
func Example() {
	dsn, drop := pgtest.ExampleDatabase(leasequeue.Migrations(""))
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	// The service's own table may reference the job that wrote the row.
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (
		order_id text PRIMARY KEY,
		job_id   bigint NOT NULL REFERENCES leasequeue_jobs (id))`); err != nil {
		panic(err)
	}

	q, err := leasequeue.New(pool, leasequeue.Config{Name: "invoices"}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		panic(err)
	}
	// Normally inside the transaction that records the order's completion.
	if _, err := q.Enqueue(ctx, pool, leasequeue.NewJob{UniqueKey: "order-42", Payload: []byte("order-42")}); err != nil {
		panic(err)
	}

	w, err := leasequeue.NewWorker(q, func(ctx context.Context, job leasequeue.Job) (leasequeue.Complete, error) {
		// Work outside any transaction (compute the invoice), then the
		// effect, run only if this claim still holds the job.
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id, job_id) VALUES ($1, $2)`, string(job.Payload), job.ID)
			return err
		}, nil
	}, leasequeue.WorkerConfig{Workers: 1})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- w.Run(runCtx) }()
	waitfor.Until(10*time.Second, func() bool {
		done, err := q.List(ctx, pool, leasequeue.ListFilter{State: leasequeue.StateDone})
		return err == nil && len(done) == 1
	})
	stop()
	if err := <-stopped; err != nil {
		panic(err)
	}

	jobs, err := q.List(ctx, pool, leasequeue.ListFilter{})
	if err != nil {
		panic(err)
	}
	j := jobs[0]
	fmt.Printf("job %s: %s after %d attempt(s), epoch %d\n", j.UniqueKey, j.State, j.Attempts, j.Epoch)
	var order string
	var jobID int64
	if err := pool.QueryRow(ctx, `SELECT order_id, job_id FROM invoices`).Scan(&order, &jobID); err != nil {
		panic(err)
	}
	fmt.Printf("invoice for %s, written by its job: %v\n", order, jobID == j.ID)
	// Output:
	// job order-42: done after 1 attempt(s), epoch 1
	// invoice for order-42, written by its job: true
}
