package migrations_test

import (
	"bytes"
	"io/fs"
	"testing"

	"github.com/lossless-dev/lossless/migrations"
)

// Each service owns its database, so the outbox schema that pkg/outbox
// expects is created by copies of the same migrations in every publishing
// service's folder. The copies must not drift: pkg/outbox's queries are
// written against exactly this schema.
func TestOutboxMigrationsAreTheSameInEveryService(t *testing.T) {
	t.Parallel()
	for _, pair := range []struct{ workorder, billing string }{
		{"00002_outbox.sql", "00002_outbox.sql"},
		{"00005_outbox_published.sql", "00003_outbox_published.sql"},
		{"00006_outbox_autovacuum.sql", "00004_outbox_autovacuum.sql"},
		{"00007_outbox_dispatching.sql", "00005_outbox_dispatching.sql"},
	} {
		want, err := fs.ReadFile(migrations.WorkOrder(), pair.workorder)
		if err != nil {
			t.Fatal(err)
		}
		got, err := fs.ReadFile(migrations.Billing(), pair.billing)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("migrations/billing/%s differs from migrations/workorder/%s; change both together", pair.billing, pair.workorder)
		}
	}
}
