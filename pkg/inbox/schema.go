package inbox

import (
	"embed"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// DefaultSchema is the PostgreSQL schema of the package's tables when none
// is configured.
const DefaultSchema = pgmigrate.DefaultSchema

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns the package's tables as a migration set for
// pgmigrate.Apply, created in schema ("" means DefaultSchema) and tracked in
// inbox_schema_version: apply it before the service's own set.
func Migrations(schema string) pgmigrate.Set {
	s := pgmigrate.PatternSet("inbox", migrationFiles, schema)
	s.AppendOnly = []string{"inbox_audit"}
	return s
}
