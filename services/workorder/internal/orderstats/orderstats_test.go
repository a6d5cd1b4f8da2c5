package orderstats_test

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"os"
	"testing"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/services/workorder/internal/orderstats"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Orders are counted in each open status; terminal ones are not, and an
// open status without orders reads 0 rather than disappearing.
func TestRefreshCountsOrdersByOpenStatus(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, migrations.WorkOrder()...)
	ctx := context.Background()
	for status, n := range map[string]int{"CREATED": 3, "HANDED_OFF": 2, "INVOICED": 4, "CANCELLED": 1} {
		if _, err := pool.Exec(ctx, `
INSERT INTO work_orders (id, customer_id, description, positions, currency_code, unit_price_minor, status)
SELECT gen_random_uuid(), 'acme', 'paint', 1, 'EUR', 100, $1 FROM generate_series(1, $2)`, status, n); err != nil {
			t.Fatal(err)
		}
	}
	m, err := orderstats.New(pool, orderstats.Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Refresh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"CREATED": 3, "HANDED_OFF": 2, "COMPLETED": 0}; !maps.Equal(got, want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
}
