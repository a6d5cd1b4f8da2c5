package libenv

import (
	"context"
	"log/slog"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// Migrate is the `<service> migrate` subcommand: it reads DATABASE_URL from r
// (failing with the variable's name when it is missing), applies the sets
// (pgmigrate.ApplyDSN) and logs the version each reached.
func Migrate(ctx context.Context, r *envconfig.Reader, logger *slog.Logger, sets ...pgmigrate.Set) error {
	dsn := r.Required("DATABASE_URL")
	if err := r.Err(); err != nil {
		return err
	}
	applied, err := pgmigrate.ApplyDSN(ctx, dsn, sets...)
	for _, a := range applied {
		logger.InfoContext(ctx, "migrated", "set", a.Name, "version", a.Version)
	}
	return err
}
