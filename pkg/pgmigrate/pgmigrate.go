// Package pgmigrate applies a service's plain-SQL goose migrations. The same
// code path runs in `<service> migrate`, in the local stack and in tests, so a
// migration that works in a test works in production.
package pgmigrate

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/pressly/goose/v3"

	"github.com/lossless-dev/lossless/pkg/envconfig"
	// Registers the "pgx" database/sql driver used by goose.
	_ "github.com/jackc/pgx/v5/stdlib"
)

// Up applies every pending migration in migrations to the database at dsn and
// returns the version reached.
func Up(ctx context.Context, dsn string, migrations fs.FS) (int64, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return 0, fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	return UpDB(ctx, db, migrations)
}

// UpDB is Up on an open database handle.
func UpDB(ctx context.Context, db *sql.DB, migrations fs.FS) (int64, error) {
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations)
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

// Command is the `<service> migrate` subcommand: it reads DATABASE_URL from
// env (failing with the variable's name when it is missing), applies
// migrations and logs the version reached.
func Command(ctx context.Context, env *envconfig.Reader, migrations fs.FS, logger *slog.Logger) error {
	dsn := env.Required("DATABASE_URL")
	if err := env.Err(); err != nil {
		return err
	}
	v, err := Up(ctx, dsn, migrations)
	if err != nil {
		return err
	}
	logger.InfoContext(ctx, "migrated", "version", v)
	return nil
}
