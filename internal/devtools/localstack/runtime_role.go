package localstack

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Each database gets a runtime role, <database>_app, as in compose and the
// k8s overlays: `migrate` runs as the owner (DSN) and grants it
// (DATABASE_RUNTIME_ROLE, pkg/pgmigrate Grant), the servers connect as it
// (RuntimeDSN), so they can append to the audit tables but not rewrite them.

// ensureRuntimeRole creates the runtime role of ownerDSN's database when
// missing (password: its name; a local server) and returns the database's
// URL as that role. A server whose user may not create roles (an external
// DATABASE_URL without CREATEROLE) keeps one role: ownerDSN is returned.
func (s *Stack) ensureRuntimeRole(ctx context.Context, ownerDSN string) (string, error) {
	u, err := url.Parse(ownerDSN)
	if err != nil {
		return "", err
	}
	db := strings.TrimPrefix(u.Path, "/")
	role := db + "_app"
	conn, err := pgx.Connect(ctx, ownerDSN)
	if err != nil {
		return "", fmt.Errorf("connect to PostgreSQL at %s: %w", redact(ownerDSN), err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
		return "", err
	}
	id := pgx.Identifier{role}.Sanitize()
	if !exists {
		// CREATE ROLE takes no parameters; the name is a quoted identifier and
		// the password the same name, quoted as a literal.
		_, err := conn.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s'`, id, strings.ReplaceAll(role, "'", "''")))
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" {
			s.logf("postgres", "%s may not create roles: the services connect as the owner of %s, which can rewrite its audit tables",
				u.User.Username(), db)
			return ownerDSN, nil
		}
		if err != nil && (!errors.As(err, &pe) || pe.Code != "42710") { // 42710: created concurrently
			return "", fmt.Errorf("create role %s: %w", role, err)
		}
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`GRANT CONNECT ON DATABASE %s TO %s`, pgx.Identifier{db}.Sanitize(), id)); err != nil {
		return "", fmt.Errorf("grant %s: %w", role, err)
	}
	u.User = url.UserPassword(role, role)
	return u.String(), nil
}

// databaseEnv is a service process's database variables: migrate runs as
// the owner and grants the runtime role; everything else connects as it.
func databaseEnv(ownerDSN, runtimeDSN string, args []string) []string {
	if runtimeDSN == "" || runtimeDSN == ownerDSN {
		return []string{"DATABASE_URL=" + ownerDSN}
	}
	if len(args) > 0 && args[0] == "migrate" {
		u, _ := url.Parse(runtimeDSN) // built by ensureRuntimeRole
		return []string{"DATABASE_URL=" + ownerDSN, "DATABASE_RUNTIME_ROLE=" + u.User.Username()}
	}
	return []string{"DATABASE_URL=" + runtimeDSN}
}
