// Package pgmigrate applies plain-SQL goose migrations in ordered sets. Each
// pattern package of pkg/ (outbox, inbox, consumer, leasequeue, idempotency,
// parked) ships its own set and each service adds its own, so a service's
// database is "the pattern sets it uses, then its own folder". Every set has
// its own version table, as River keeps river_migration apart from the
// application's migrations: versions of different owners never collide, and
// a pattern package can add a migration without renumbering a service's.
//
// The same code path runs in `<service> migrate`, in the local stack and in
// tests, so a migration that works in a test works in production. Two
// migrate runs against one database are serialised by a session-level
// advisory lock (goose's Postgres session locker), so two migrate Jobs of a
// rolling deploy cannot race.
//
// Lesson: a pattern package owns its schema the way it owns its code, and
// applies it by the same path everywhere (ADR 0011). It guards no numbered
// failure mode of its own; every guard that relies on a table, a unique key
// or an index relies on this package having created it, identically in
// tests and production.
package pgmigrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	// Registers the "pgx" database/sql driver used by goose.
	_ "github.com/jackc/pgx/v5/stdlib"
)

// DefaultVersionTable is goose's own default, used by a service's set.
const DefaultVersionTable = "goose_db_version"

// Set is one owner's migrations.
type Set struct {
	// Name identifies the set in errors and logs ("outbox", "workorder").
	Name string
	// Schema holds the set's objects and version table, and is created
	// before the set runs when missing. Default "public". Apply replaces the
	// placeholder {schema} in the files with it (Render), so a pattern
	// package's tables land where the service configured them.
	Schema string
	// FS holds the goose SQL files (NNNNN_name.sql) at its root.
	FS fs.FS
	// VersionTable is the set's goose version table inside Schema. Default
	// DefaultVersionTable; a pattern package uses "<name>_schema_version".
	VersionTable string
	// AppendOnly names the set's tables (in Schema) that the runtime role
	// may only INSERT into and SELECT from: the audit trails (Grant).
	AppendOnly []string
}

// PatternSet is the set a pattern package of pkg/ ships: the *.sql files
// under "migrations/" in files (its embedded folder), created in schema (""
// means "public"), tracked in "<name>_schema_version" inside that schema.
func PatternSet(name string, files fs.FS, schema string) Set {
	sub, err := fs.Sub(files, "migrations")
	if err != nil {
		// fs.Sub fails only on an invalid path, and "migrations" is valid.
		panic(err)
	}
	return Set{Name: name, Schema: SchemaOrDefault(schema), FS: sub, VersionTable: name + "_schema_version"}
}

// Applied is what Apply did to one set.
type Applied struct {
	Name    string
	Version int64
}

func (s *Set) setDefaults() {
	s.Schema = SchemaOrDefault(s.Schema)
	if s.VersionTable == "" {
		s.VersionTable = DefaultVersionTable
	}
}

// Validate reports a set that cannot be applied.
func (s Set) Validate() error {
	if s.Name == "" {
		return errors.New("migration set: Name is required")
	}
	if s.FS == nil {
		return fmt.Errorf("migration set %s: FS is required", s.Name)
	}
	if err := ValidateSchema(s.Schema); err != nil {
		return fmt.Errorf("migration set %s: %w", s.Name, err)
	}
	if err := ValidateSchema(s.VersionTable); err != nil {
		return fmt.Errorf("migration set %s: version table: %w", s.Name, err)
	}
	return nil
}

// Apply applies every pending migration of each set, in order, and returns
// the version each set reached. It stops at the first failing set. db is a
// *sql.DB, not a pgdb.DB, because goose runs on database/sql.
func Apply(ctx context.Context, db *sql.DB, sets ...Set) ([]Applied, error) {
	if len(sets) == 0 {
		return nil, errors.New("no migration sets")
	}
	seen := map[string]bool{}
	for i := range sets {
		sets[i].setDefaults()
		if err := sets[i].Validate(); err != nil {
			return nil, err
		}
		key := sets[i].Schema + "." + sets[i].VersionTable
		if seen[key] {
			return nil, fmt.Errorf("migration set %s: version table %s is used by another set", sets[i].Name, key)
		}
		seen[key] = true
	}
	out := make([]Applied, 0, len(sets))
	for _, s := range sets {
		v, err := apply(ctx, db, s)
		if err != nil {
			return out, fmt.Errorf("migration set %s: %w", s.Name, err)
		}
		out = append(out, Applied{Name: s.Name, Version: v})
	}
	return out, nil
}

// ApplyDSN is Apply on a database opened from dsn for the duration of the call.
func ApplyDSN(ctx context.Context, dsn string, sets ...Set) ([]Applied, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	return Apply(ctx, db, sets...)
}

// qCreateSchema runs before goose, whose version table must have a schema to
// live in, and so before goose's lock. The name was validated
// (ValidateSchema), so it needs no quoting.
const qCreateSchema = `CREATE SCHEMA IF NOT EXISTS %s`

func apply(ctx context.Context, db *sql.DB, s Set) (int64, error) {
	if _, err := db.ExecContext(ctx, fmt.Sprintf(qCreateSchema, s.Schema)); err != nil && !schemaCreatedConcurrently(err) {
		return 0, fmt.Errorf("create schema %s: %w", s.Schema, err)
	}
	files, err := RenderFS(s.FS, s.Schema)
	if err != nil {
		return 0, err
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return 0, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithTableName(s.Schema+"."+s.VersionTable),
		goose.WithSessionLocker(locker),
		// Pattern packages and services register no Go migrations; the
		// global registry would let one leak into another's set.
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return 0, fmt.Errorf("load migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return 0, fmt.Errorf("apply migrations: %w", err)
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("read migration version: %w", err)
	}
	return v, nil
}

// schemaCreatedConcurrently: IF NOT EXISTS is not atomic. Two runs that both
// found the schema missing both create it, and the loser fails on the
// catalog's unique index (23505) or as a duplicate (42P06); either way the
// schema exists, which is all this run needs.
func schemaCreatedConcurrently(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "42P06")
}
