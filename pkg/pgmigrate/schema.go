package pgmigrate

import (
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"testing/fstest"
)

// A pattern package (outbox, inbox, dedup, leasequeue, idempotency, parked)
// keeps its tables in a PostgreSQL schema chosen by the service that embeds
// it, as River's Schema option does. The package writes its migrations and
// query constants with the placeholder {schema} in front of every object it
// owns ({schema}.outbox) and renders them once, at construction, with a
// validated name: once per constructor call, never per query, and the
// placeholder keeps the constants readable and greppable.

// Placeholder is replaced by the schema name in migrations and queries.
const Placeholder = "{schema}"

// DefaultSchema is the schema a pattern package uses when none is configured.
const DefaultSchema = "public"

// identifier is a conservative PostgreSQL identifier: lower case so that it
// never needs quoting (an unquoted name is folded to lower case, so "Billing"
// would silently be billing in one place and "Billing" in another), and at
// most 63 bytes (NAMEDATALEN-1, beyond which PostgreSQL truncates).
var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema reports whether name can be used as a schema name.
func ValidateSchema(name string) error {
	if !identifier.MatchString(name) {
		return fmt.Errorf("schema %q: must match %s (lower case, unquoted, at most 63 bytes)", name, identifier)
	}
	if strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("schema %q: the pg_ prefix is reserved by PostgreSQL", name)
	}
	return nil
}

// SchemaOrDefault returns name, or DefaultSchema when name is empty.
func SchemaOrDefault(name string) string {
	if name == "" {
		return DefaultSchema
	}
	return name
}

// Render replaces every Placeholder in sql with schema. The caller validates
// schema first (ValidateSchema): Render does not quote.
func Render(sql, schema string) string {
	return strings.ReplaceAll(sql, Placeholder, schema)
}

// RenderFS returns a copy of the *.sql files at the root of fsys with every
// Placeholder replaced by schema, for goose. The caller validates schema.
func RenderFS(fsys fs.FS, schema string) (fs.FS, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no *.sql migrations at the root")
	}
	out := fstest.MapFS{}
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		out[n] = &fstest.MapFile{Data: []byte(Render(string(b), schema)), Mode: 0o444}
	}
	return out, nil
}
