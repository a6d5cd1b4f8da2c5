package consumer

import (
	"embed"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// DefaultSchema is the PostgreSQL schema of the package's tables when none
// is configured.
const DefaultSchema = pgmigrate.DefaultSchema

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns the package's schema as a migration set for
// pgmigrate.Apply, to be created in the PostgreSQL schema named schema (""
// means DefaultSchema). Its versions are tracked in their own table,
// dedup_schema_version (the name this table's migrations were first
// shipped under: a deployed database keeps it), apart from the service's:
// apply it before the service's own set, whose tables may reference it.
func Migrations(schema string) pgmigrate.Set {
	return pgmigrate.PatternSet("dedup", migrationFiles, schema)
}
