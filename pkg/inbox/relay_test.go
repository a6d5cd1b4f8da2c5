package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// panicOn applies every entry (one row in effects) except the event poison,
// whose handler panics, first doing what holdConn says: with an unread query
// result left on the connection, the savepoint cannot even be rolled back and
// the claim transaction is lost.
func panicOn(poison string, holdConn bool) inbox.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, e *inbox.Entry) error {
		if e.EventID == poison {
			if holdConn {
				rows, err := tx.Query(ctx, `SELECT generate_series(1, 100000)`)
				if err != nil {
					return err
				}
				rows.Next()
			}
			panic(fmt.Sprintf("nil map in %s", e.EventID))
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, e.EventID)
		return err
	}
}

// panicBatch is a BatchHandler whose HandleBatch panics on the poison too.
type panicBatch struct{ inbox.HandlerFunc }

func (h panicBatch) HandleBatch(ctx context.Context, tx pgx.Tx, es []*inbox.Entry) ([]error, error) {
	for _, e := range es {
		if err := h.Handle(ctx, tx, e); err != nil {
			return nil, err
		}
	}
	return make([]error, len(es)), nil
}

func TestPanic_PoisonEntryIsParkedOthersApplied(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]inbox.Handler{
		"savepoint":        panicOn("e4", false),
		"transaction_lost": panicOn("e4", true),
		"batch_handler":    panicBatch{panicOn("e4", false)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.effectsTable(t)
			ctx := context.Background()
			var batch []inbox.Message
			for i := range 12 {
				batch = append(batch, msg(fmt.Sprintf("e%d", i), fmt.Sprintf("k%d", i), "p"))
			}
			if _, err := b.store.Ingest(ctx, batch); err != nil {
				t.Fatal(err)
			}
			const maxAttempts = 3
			r, err := inbox.NewRelay(b.pool, h, inbox.Config{
				BatchSize: 5, PollInterval: 5 * time.Millisecond, MaxAttempts: maxAttempts,
				TechnicalBackoff: retry.Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond},
			}, slog.New(slog.DiscardHandler), nil)
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(runCtx) }()
			t.Cleanup(func() {
				stop()
				if err := <-done; err != nil {
					t.Error(err)
				}
			})

			waitfor.Condition(t, 20*time.Second, "poison parked, every other entry applied", func() bool {
				return b.count(t, `SELECT count(*) FROM inbox WHERE status = 'PARKED'`) == 1 &&
					b.count(t, `SELECT count(*) FROM inbox WHERE status = 'APPLIED'`) == 11
			})
			var status, reason, lastErr string
			var attempts int
			if err := b.pool.QueryRow(ctx, `SELECT status, park_reason, last_error, attempts FROM inbox WHERE event_id = 'e4'`).
				Scan(&status, &reason, &lastErr, &attempts); err != nil {
				t.Fatal(err)
			}
			if status != "PARKED" || reason != inbox.ReasonPanic || !strings.HasPrefix(lastErr, "panic: nil map in e4") || attempts != maxAttempts {
				t.Fatalf("poison: %s %s %q after %d attempts; want PARKED %s, the panic, %d attempts",
					status, reason, lastErr, attempts, inbox.ReasonPanic, maxAttempts)
			}
			if n := b.count(t, `SELECT count(*) FROM effects`); n != 11 {
				t.Fatalf("effects = %d, want one per applied entry (11)", n)
			}
		})
	}
}
