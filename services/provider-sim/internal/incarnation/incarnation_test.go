package incarnation_test

import (
	"context"
	"os"
	"testing"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/incarnation"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestEachInstanceCountsItsOwnStarts(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, migrations.ProviderSim()...)
	next := func(instance string) int64 {
		t.Helper()
		n, err := incarnation.Next(context.Background(), pool, instance)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	got := []int64{next("provider-sim-1"), next("provider-sim-1"), next("provider-sim-2"), next(""), next("provider-sim-1"), next("")}
	want := []int64{1, 2, 1, 1, 3, 2}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("starts = %v, want %v", got, want)
		}
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM incarnations`).Scan(&rows); err != nil || rows != 3 {
		t.Fatalf("incarnation rows = %d (err %v), want one per instance (3)", rows, err)
	}
}
