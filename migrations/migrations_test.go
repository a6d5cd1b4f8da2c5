package migrations_test

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Every service database migrates from empty, and a second run (the migrate
// Job of the next deploy) changes nothing.
func TestEveryServiceMigratesFromEmptyAndAgainIsANoop(t *testing.T) {
	t.Parallel()
	for name, sets := range map[string]func() []pgmigrate.Set{
		"workorder":   migrations.WorkOrder,
		"billing":     migrations.Billing,
		"providersim": migrations.ProviderSim,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dsn := pgtest.NewDatabase(t, sets()...)
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			again, err := pgmigrate.Apply(context.Background(), db, sets()...)
			if err != nil {
				t.Fatalf("second migrate: %v", err)
			}
			if len(again) != len(sets()) {
				t.Fatalf("second migrate applied %d sets, want %d", len(again), len(sets()))
			}
			for _, a := range again {
				if a.Version < 1 {
					t.Errorf("set %s at version %d after migrating", a.Name, a.Version)
				}
			}
		})
	}
}
