package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// The main path (claim, replay, mismatch, expiry takeover, cleanup) runs
// against a non-default schema while public holds no table at all: an
// unqualified table name in any statement would fail with "relation does not
// exist".
func TestEveryQueryUsesTheConfiguredSchema(t *testing.T) {
	t.Parallel()
	b := setupIn(t, "idem_elsewhere", idempotency.Config{Retention: time.Hour})
	ctx := context.Background()
	if n := b.count(t, `pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != 0 {
		t.Fatalf("public holds %d relations, want none", n)
	}

	first, replayed, err := b.create(ctx, "key-1", "a")
	if err != nil || replayed {
		t.Fatalf("first: replayed=%v err=%v", replayed, err)
	}
	second, replayed, err := b.create(ctx, "key-1", "a")
	if err != nil || !replayed || second.GetValue() != first.GetValue() {
		t.Fatalf("replay: %v replayed=%v err=%v, want %v", second, replayed, err, first)
	}
	if _, _, err := b.create(ctx, "key-1", "b"); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("other payload: %v, want ErrMismatch", err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE idem_elsewhere.idempotency_keys SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if _, replayed, err := b.create(ctx, "key-1", "b"); err != nil || replayed {
		t.Fatalf("expired key reuse: replayed=%v err=%v", replayed, err)
	}
	if _, _, err := b.create(ctx, "key-2", "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE idem_elsewhere.idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'key-2'`); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.Cleanup(ctx); err != nil || n != 1 {
		t.Fatalf("cleanup: %d %v, want 1 (key-2)", n, err)
	}
	if n := b.count(t, `idem_elsewhere.idempotency_keys WHERE key = 'key-1' AND response IS NOT NULL`); n != 1 {
		t.Fatalf("key-1 rows: %d, want 1 with its response", n)
	}
	if n := b.count(t, b.effects); n != 3 {
		t.Fatalf("effects: %d, want 3 (a, b after expiry, c)", n)
	}
	if n := b.count(t, `pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != 0 {
		t.Fatalf("public holds %d relations after the run, want none", n)
	}
}

// A schema name that would need quoting (or could inject SQL) is refused,
// with an error naming it; nothing is rendered with it.
func TestNewStoreRefusesAnInvalidSchema(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, idempotency.Migrations(""))
	for _, schema := range []string{"Api", "pg_keys", "a.b", "x; DROP TABLE y"} {
		_, err := idempotency.NewStore(pool, idempotency.Config{}, slog.New(slog.DiscardHandler), nil, idempotency.WithSchema(schema))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", schema)) {
			t.Errorf("WithSchema(%q): %v, want an error naming it", schema, err)
		}
	}
}
