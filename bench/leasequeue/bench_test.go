package leasequeue_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/testkit/benchkit"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// TestMain runs the benchmark on the server benchkit reads from the
// environment (fsync on with LOSSLESS_PG_FSYNC=on).
func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }

// BenchmarkBurnDown is B3's no-op burn-down on its own: N jobs inserted, then
// W handlers drain them; reports jobs/s. B3 itself, against River v0.51.2 on
// the same server, is bench/river-compare's BenchmarkB3_LeaseQueueVsRiver
// (`make bench-river`). With LOSSLESS_PG_FSYNC=on the ephemeral server keeps
// fsync on.
func BenchmarkBurnDown(b *testing.B) {
	// Sizes: LEASEQUEUE_BENCH_JOBS (default 100000) and
	// LEASEQUEUE_BENCH_WORKERS (default 100, River's anchor figure).
	jobs := benchkit.EnvInt(b, "LEASEQUEUE_BENCH_JOBS", 100_000)
	workers := benchkit.EnvInt(b, "LEASEQUEUE_BENCH_WORKERS", 100)
	ctx := context.Background()
	pool := pgtest.NewPool(b, leasequeue.Migrations(""))
	q, err := leasequeue.New(pool, leasequeue.Config{Name: "bench"}, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil)
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for range b.N {
		b.StopTimer()
		if _, err := pool.Exec(ctx, `DELETE FROM leasequeue_jobs`); err != nil {
			b.Fatal(err)
		}
		batch := make([]leasequeue.NewJob, 0, 5000)
		for i := 0; i < jobs; i += len(batch) {
			batch = batch[:0]
			for j := 0; j < cap(batch) && i+j < jobs; j++ {
				batch = append(batch, leasequeue.NewJob{})
			}
			if _, err := q.Enqueue(ctx, pool, batch...); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE leasequeue_jobs`); err != nil {
			b.Fatal(err)
		}
		var done atomic.Int64
		finished := make(chan struct{})
		w, err := leasequeue.NewWorker(q, func(context.Context, leasequeue.Job) (leasequeue.Complete, error) {
			if done.Add(1) == int64(jobs) {
				close(finished)
			}
			return nil, nil
		}, leasequeue.WorkerConfig{Workers: workers, PollInterval: 20 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		stopped := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { stopped <- w.Run(runCtx) }()
		<-finished
		// Like River's figure: handlers ran for every job; then wait for the
		// last completions to commit before checking none was lost.
		elapsed := time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-stopped; err != nil {
			b.Fatal(err)
		}
		var doneRows int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'done'`).Scan(&doneRows); err != nil {
			b.Fatal(err)
		}
		if doneRows != jobs {
			b.Fatalf("%d of %d jobs done: lost or duplicated work", doneRows, jobs)
		}
		total += elapsed
	}
	b.ReportMetric(float64(jobs*b.N)/total.Seconds(), "jobs/s")
}
