package leasequeue

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// One completion batch may hold two claims of the same job: a stale claim
// and its successor (the same worker rescued its own expired job while the
// stale outcome waited for a completer). Only the current claim's effects
// may run; the stale one is fenced off.
func TestCompleteBatchWithStaleAndCurrentClaimOfOneJob(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, Migrations(""))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (job_id bigint NOT NULL, epoch bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	q, err := New(pool, Config{Name: "t"}, slog.New(slog.NewJSONHandler(io.Discard, nil)), nil, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, pool, NewJob{}); err != nil {
		t.Fatal(err)
	}
	stale, err := q.Claim(ctx, "w", 1, 0)
	if err != nil || len(stale) != 1 {
		t.Fatal(stale, err)
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	current, err := q.ClaimExpired(ctx, "w", 1)
	if err != nil || len(current) != 1 {
		t.Fatal(current, err)
	}
	effect := func(j Job) Complete {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, j.ID, j.Epoch)
			return err
		}
	}
	errs := q.completeBatch(ctx, []completion{{stale[0], effect(stale[0])}, {current[0], effect(current[0])}})
	if !errors.Is(errs[0], ErrLeaseLost) || errs[1] != nil {
		t.Fatalf("errs %v", errs)
	}
	var n, epoch int64
	if err := pool.QueryRow(ctx, `SELECT count(*), max(epoch) FROM effects`).Scan(&n, &epoch); err != nil || n != 1 || epoch != 2 {
		t.Fatalf("effects: %d rows, epoch %d, %v; want one of epoch 2", n, epoch, err)
	}
	lost, err := q.Heartbeat(ctx, []Job{stale[0]})
	if err != nil || len(lost) != 1 {
		t.Fatalf("heartbeat of stale claim: %v %v", lost, err)
	}
}
