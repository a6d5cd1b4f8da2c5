package libenv

import (
	"context"
	"log/slog"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// EnvRuntimeRole names the role the service's replicas connect as, which
// `migrate` grants what they need (pgmigrate.Grant) after migrating as
// DATABASE_URL's role, the tables' owner.
const EnvRuntimeRole = "DATABASE_RUNTIME_ROLE"

// Migrate is the `<service> migrate` subcommand: it reads DATABASE_URL from r
// (failing with the variable's name when it is missing), applies the sets
// (pgmigrate.ApplyDSN), logs the version each reached and, when
// DATABASE_RUNTIME_ROLE is set, grants that role its privileges
// (pgmigrate.GrantDSN: read-write on the tables, append-only on the audit
// tables). Unset, the service runs as the owner, which can rewrite its
// audit trail: a warning says so.
func Migrate(ctx context.Context, r *envconfig.Reader, logger *slog.Logger, sets ...pgmigrate.Set) error {
	dsn := r.Required("DATABASE_URL")
	role := r.String(EnvRuntimeRole, "")
	if err := r.Err(); err != nil {
		return err
	}
	applied, err := pgmigrate.ApplyDSN(ctx, dsn, sets...)
	for _, a := range applied {
		logger.InfoContext(ctx, "migrated", "set", a.Name, "version", a.Version)
	}
	if err != nil {
		return err
	}
	if role == "" {
		logger.WarnContext(ctx, EnvRuntimeRole+" is not set: no runtime role granted; a service that connects as the "+
			"tables' owner can update and delete its audit rows (deploy/k8s/README.md, database roles)")
		return nil
	}
	if err := pgmigrate.GrantDSN(ctx, dsn, role, sets...); err != nil {
		return err
	}
	logger.InfoContext(ctx, "granted the runtime role", "role", role)
	return nil
}
