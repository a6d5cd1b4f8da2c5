// Package migrations lists the migration sets of every service database:
// the pattern packages' own sets (pkg/outbox, pkg/inbox, ...), applied first,
// then the service's folder here. Each service owns exactly one database;
// services never read each other's tables.
package migrations

import (
	"embed"
	"io/fs"

	"github.com/lossless-dev/lossless/pkg/consumer"
	"github.com/lossless-dev/lossless/pkg/idempotency"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

//go:embed workorder/*.sql billing/*.sql providersim/*.sql
var all embed.FS

// WorkOrder returns the sets of the work-order service database, in the
// order they are applied.
func WorkOrder() []pgmigrate.Set {
	return []pgmigrate.Set{
		outbox.Migrations(""),
		inbox.Migrations(""),
		consumer.Migrations(""),
		idempotency.Migrations(""),
		parked.Migrations(""),
		own("workorder", "operator_audit"),
	}
}

// Billing returns the sets of the billing service database, in the order
// they are applied.
func Billing() []pgmigrate.Set {
	return []pgmigrate.Set{
		outbox.Migrations(""),
		consumer.Migrations(""),
		leasequeue.Migrations(""),
		parked.Migrations(""),
		own("billing", "operator_audit"),
	}
}

// ProviderSim returns the sets of the provider simulator's database.
func ProviderSim() []pgmigrate.Set {
	return []pgmigrate.Set{own("providersim", "operator_audit")}
}

// own is a service's folder, tracked in goose's default version table;
// appendOnly are its audit tables, which the runtime role may only append
// to and read (pgmigrate.Grant).
func own(dir string, appendOnly ...string) pgmigrate.Set {
	f, err := fs.Sub(all, dir)
	if err != nil {
		// fs.Sub fails only on an invalid path, which is a constant above.
		panic(err)
	}
	return pgmigrate.Set{Name: dir, FS: f, AppendOnly: appendOnly}
}
