package app_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// BenchmarkInvoiceBurnDown is B3 with real invoice work: N completion events
// consumed into jobs, then W invoice workers issue N invoices (invoice +
// lines + InvoiceIssued outbox row + fenced done mark per job, group
// committed). Reports invoices/s. BILLING_BENCH_JOBS (default 20000),
// BILLING_BENCH_WORKERS (default 100), BILLING_BENCH_COMPLETERS (8) and
// BILLING_BENCH_COMPLETE_BATCH (32), the service's defaults.
func BenchmarkInvoiceBurnDown(b *testing.B) {
	jobs, workers := 20000, 100
	if v, err := strconv.Atoi(os.Getenv("BILLING_BENCH_JOBS")); err == nil && v > 0 {
		jobs = v
	}
	if v, err := strconv.Atoi(os.Getenv("BILLING_BENCH_WORKERS")); err == nil && v > 0 {
		workers = v
	}
	var total time.Duration
	for range b.N {
		b.StopTimer()
		bundle := setupB(b)
		ctx := context.Background()
		for i := 0; i < jobs; i += 1000 {
			ms := make([]*pubsub.Received, 0, 1000)
			for j := 0; j < 1000 && i+j < jobs; j++ {
				ms = append(ms, received(b, completion(uuid.New())))
			}
			for _, err := range bundle.c.Intake.HandleBatch(ctx, ms) {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
		cfg := bundle.cfg.Worker
		cfg.Workers, cfg.Owner, cfg.PollInterval = workers, "bench", 20*time.Millisecond
		cfg.Completers, cfg.CompleteBatch = benchInt("BILLING_BENCH_COMPLETERS", 8), benchInt("BILLING_BENCH_COMPLETE_BATCH", 32)
		w, err := newWorker(bundle, cfg)
		if err != nil {
			b.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		stopped := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { stopped <- w.Run(runCtx) }()
		var issued int
		if !waitfor.Until(10*time.Minute, func() bool {
			if err := bundle.pool.QueryRow(ctx, `SELECT count(*) FROM invoices`).Scan(&issued); err != nil {
				b.Fatal(err)
			}
			return issued == jobs
		}) {
			b.Fatalf("burn-down stalled: %d of %d invoices", issued, jobs)
		}
		total += time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-stopped; err != nil {
			b.Fatal(err)
		}
		// Every event appended, delivered or not (no relay runs here).
		var events int
		if err := bundle.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_events`).Scan(&events); err != nil || events != jobs {
			b.Fatalf("InvoiceIssued events %d, want %d (%v)", events, jobs, err)
		}
	}
	b.ReportMetric(float64(jobs*b.N)/total.Seconds(), "invoices/s")
}

func benchInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
