package correlation_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/inbox"
)

// BenchmarkRelayCorrelation measures the correlation relay draining a
// backlog of completions, each completing its own order (lock order, lock
// waiting point, applied-event row, update, transition, consume, outbox
// append, entry status): 1 and 2 relays on the same server.
func BenchmarkRelayCorrelation(b *testing.B) {
	for _, relays := range []int{1, 2} {
		b.Run(fmt.Sprintf("relays=%d", relays), func(b *testing.B) {
			const n = 5000
			b.StopTimer()
			bb := setup(b)
			ctx := context.Background()
			if _, err := bb.pool.Exec(ctx, `
INSERT INTO work_orders (id, customer_id, description, positions, currency_code, unit_price_minor, status)
SELECT gen_random_uuid(), 'c', 'd', 1, 'EUR', 1, 'HANDED_OFF' FROM generate_series(1, $1);
`, n); err != nil {
				b.Fatal(err)
			}
			if _, err := bb.pool.Exec(ctx, `INSERT INTO waiting_points (work_order_id, cause) SELECT id, 'handoff' FROM work_orders`); err != nil {
				b.Fatal(err)
			}
			rows, _ := bb.pool.Query(ctx, `SELECT id FROM work_orders`)
			var msgs []inbox.Message
			for rows.Next() {
				var id uuid.UUID
				_ = rows.Scan(&id)
				msgs = append(msgs, completed("c-"+id.String(), id, 1))
			}
			rows.Close()
			if _, err := bb.store.Ingest(ctx, msgs); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for range relays {
				r, err := inbox.NewRelay(bb.pool, bb.handler, inbox.Config{}, quietLogger(), nil)
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					for {
						k, err := r.ProcessBatch(ctx)
						if err != nil {
							b.Error(err)
							return
						}
						if k == 0 {
							return
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			var applied int
			_ = bb.pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE status = 'APPLIED'`).Scan(&applied)
			if applied != n {
				b.Fatalf("applied %d of %d", applied, n)
			}
			b.ReportMetric(float64(n)/elapsed.Seconds(), "entries/s")
		})
	}
}
