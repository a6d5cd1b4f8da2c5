package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
)

// BenchmarkSubmit measures acceptance: one idempotent insert per new order.
func BenchmarkSubmit(b *testing.B) {
	bd := setupB(b)
	e, err := engine.New(bd.pool, bd.pub, bd.dice, testConfig(), bd.logger, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := e.Submit(context.Background(), engine.Order{
				WorkOrderID: uuid.New(), CustomerID: "c", Description: "d", Positions: 1,
			}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "orders/s")
}

// BenchmarkBurnDown measures jobs/s through claim -> started published ->
// completion published -> done, with zero execution time and 32 workers.
func BenchmarkBurnDown(b *testing.B) {
	bd := setupB(b)
	pcfg := bd.pool.Config()
	pcfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	bd.pool = pool
	cfg := testConfig()
	cfg.Workers = 32
	cfg.ExecBase, cfg.ExecPerPosition = time.Nanosecond, 0
	e, err := engine.New(bd.pool, bd.pub, bd.dice, cfg, bd.logger, nil)
	if err != nil {
		b.Fatal(err)
	}
	const n = 2000
	for range n {
		if _, _, err := e.Submit(context.Background(), engine.Order{
			WorkOrderID: uuid.New(), CustomerID: "c", Description: "d", Positions: 1,
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = e.Run(ctx) }()
		var left int
		if !waitfor.Until(10*time.Minute, func() bool {
			if err := bd.pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs WHERE status <> 'DONE'`).Scan(&left); err != nil {
				b.Fatal(err)
			}
			return left == 0
		}) {
			b.Fatalf("burn-down stalled: %d jobs not done", left)
		}
		cancel()
		<-done
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "jobs/s")
}
