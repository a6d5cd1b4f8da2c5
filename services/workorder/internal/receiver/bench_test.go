package receiver_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// BenchmarkB4_ReceiverIngest measures the inbox receiver end to end (emulator
// Pull -> one multi-row INSERT ... ON CONFLICT DO NOTHING per batch -> ack
// after commit) against the inbox-style insert anchor of docs/performance.md
// (anchorTPS: 4 clients, one row per commit),
// measured on the same server in the same run, alternating A B A B A B.
// 10% of the published messages are duplicates (same event id republished):
// they must add zero rows. Run with LOSSLESS_PG_FSYNC=on (make bench).
func BenchmarkB4_ReceiverIngest(b *testing.B) {
	const (
		unique = 9000
		dups   = 1000 // 10% of 10,000 messages
		rounds = 3
	)
	bd := setup(b, nil)
	ctx := context.Background()
	if _, err := bd.pool.Exec(ctx, `CREATE TABLE anchor_inbox (message_id text PRIMARY KEY, payload jsonb NOT NULL, received_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		b.Fatal(err)
	}
	var ratios, rates, anchors []float64
	for round := range rounds {
		// B: publish the round's messages first (publishing is not measured),
		// then time the drain.
		order := uuid.New()
		bd.emu.Server.ClearMessages()
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < unique+dups; i += 8 {
					id := fmt.Sprintf("r%d-%d", round, i%unique) // i >= unique repeats an earlier id
					key := uuid.NewSHA1(order, []byte(id)).String()
					if _, err := bd.pub.PublishRaw(ctx, mustData(id, order), attrs(id), key); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		before := round * unique
		t0 := time.Now()
		stop := bd.receiveUntilStopped(b)
		waitfor.Condition(b, 2*time.Minute, "round drained", func() bool {
			return bd.allAcked() && bd.count(b, `SELECT count(*) FROM inbox`) == before+unique
		})
		elapsed := time.Since(t0)
		stop()
		rate := float64(unique+dups) / elapsed.Seconds()
		// A: the anchor for the same wall time.
		anchor := anchorTPS(b, bd, elapsed)
		rates, anchors, ratios = append(rates, rate), append(anchors, anchor), append(ratios, rate/anchor)
	}
	if got := bd.count(b, `SELECT count(*) FROM inbox`); got != rounds*unique {
		b.Fatalf("rows = %d, want %d: duplicates must add zero rows", got, rounds*unique)
	}
	b.ReportMetric(median(rates), "msgs/s")
	b.ReportMetric(median(anchors), "anchor_tps")
	b.ReportMetric(median(ratios), "ratio")
	b.Logf("B4 rounds: receiver msgs/s %v, anchor tps %v, ratios %v", rates, anchors, ratios)
}

// anchorTPS runs the inbox-style insert anchor's statement with 4 clients for d.
func anchorTPS(b *testing.B, bd bundle, d time.Duration) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	total := 0
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			conn, err := bd.pool.Acquire(context.Background())
			if err != nil {
				b.Error(err)
				return
			}
			defer conn.Release()
			n := 0
			for ctx.Err() == nil {
				_, err := conn.Exec(ctx, `INSERT INTO anchor_inbox(message_id, payload) VALUES (gen_random_uuid()::text, '{"order_id":"ord_0123456789","amount_cents":12345,"currency":"USD","kind":"OrderCompleted"}') ON CONFLICT (message_id) DO NOTHING`)
				if err == nil {
					n++
				}
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	return float64(total) / d.Seconds()
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// receiveUntilStopped runs the receiver with the production defaults.
func (bd bundle) receiveUntilStopped(b *testing.B) func() {
	sub, err := pubsub.NewSubscriber(bd.emu.Client, topology.SubWorkOrderCompleted, pubsub.SubscriberConfig{}, quiet, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.RunBatch(ctx, receiver.Handle(bd.store, decoder(b), quiet)) }()
	return func() { cancel(); <-done }
}
