package migrations_test

import (
	"bytes"
	"io/fs"
	"testing"

	"github.com/lossless-dev/lossless/migrations"
)

// Each service owns its database, so the outbox schema that pkg/outbox
// expects is created by a copy of one migration in every publishing
// service's folder. The copies must not drift: pkg/outbox's queries are
// written against exactly this schema.
func TestOutboxMigrationIsTheSameInEveryService(t *testing.T) {
	t.Parallel()
	want, err := fs.ReadFile(migrations.WorkOrder(), "00002_outbox.sql")
	if err != nil {
		t.Fatal(err)
	}
	got, err := fs.ReadFile(migrations.Billing(), "00002_outbox.sql")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("migrations/billing/00002_outbox.sql differs from migrations/workorder/00002_outbox.sql; change both together")
	}
}
