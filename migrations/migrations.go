// Package migrations embeds the plain-SQL goose migrations of every service
// database. Each service owns exactly one folder and one database; services
// never read each other's tables.
package migrations

import (
	"embed"
	"io/fs"
)

//go:embed workorder/*.sql billing/*.sql providersim/*.sql
var all embed.FS

// WorkOrder returns the migrations of the work-order service database.
func WorkOrder() fs.FS { return sub("workorder") }

// Billing returns the migrations of the billing service database.
func Billing() fs.FS { return sub("billing") }

// ProviderSim returns the migrations of the provider simulator's database.
func ProviderSim() fs.FS { return sub("providersim") }

func sub(dir string) fs.FS {
	f, err := fs.Sub(all, dir)
	if err != nil {
		// fs.Sub fails only on an invalid path, which is a constant above.
		panic(err)
	}
	return f
}
