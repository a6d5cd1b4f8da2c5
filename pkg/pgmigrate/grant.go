package pgmigrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A production database has two roles. The migration role owns every table
// (it runs `<service> migrate`); the runtime role, the one the service's
// replicas connect as, owns nothing and holds only what Grant gives it. An
// owner can always UPDATE, DELETE and TRUNCATE its tables, and can grant
// itself back any privilege revoked: an audit trail the service's own role
// can rewrite proves nothing. With the split, a compromised or buggy
// service can append to the audit tables (Set.AppendOnly) and read them,
// never change or remove a row, and cannot touch the schema.

// Grant gives role, the runtime role, what the service needs on the
// objects in the sets' schemas and no more:
//
//   - USAGE on each schema;
//   - SELECT, INSERT, UPDATE, DELETE on every table, then UPDATE, DELETE
//     and TRUNCATE revoked on each set's AppendOnly tables (INSERT and
//     SELECT only), and INSERT, UPDATE, DELETE on each set's version table
//     (SELECT only: only migrate moves a version);
//   - USAGE, SELECT on every sequence (nextval of serial columns).
//
// No CREATE: the runtime role cannot add or alter objects. It runs as the
// migration role, after Apply, every time: GRANT ... ON ALL TABLES covers
// only the tables that exist, so a table added by a later migration is
// granted by the run that adds it. Idempotent, in one transaction. role is
// quoted, so it may be any role name (a Cloud SQL IAM user's e-mail-like
// name included); it must not be the role that runs Grant, which owns the
// tables and would keep every privilege.
func Grant(ctx context.Context, db *sql.DB, role string, sets ...Set) error {
	if role == "" {
		return errors.New("pgmigrate: Grant needs the runtime role")
	}
	for i := range sets {
		sets[i].setDefaults()
		if err := sets[i].Validate(); err != nil {
			return err
		}
		for _, t := range sets[i].AppendOnly {
			if err := ValidateSchema(t); err != nil {
				return fmt.Errorf("migration set %s: append-only table: %w", sets[i].Name, err)
			}
		}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var exists, self bool
	if err := tx.QueryRowContext(ctx, qRole, role).Scan(&exists, &self); err != nil {
		return fmt.Errorf("grant to %s: %w", role, err)
	}
	if !exists {
		return fmt.Errorf("grant to %s: no such role: create it (LOGIN) before migrating", role)
	}
	if self {
		return fmt.Errorf("grant to %s: that is the migration role itself, which owns the tables; the service must run as another role", role)
	}
	r := pgx.Identifier{role}.Sanitize()
	var stmts []string
	done := map[string]bool{}
	for _, s := range sets {
		if !done[s.Schema] {
			done[s.Schema] = true
			stmts = append(stmts,
				fmt.Sprintf(`GRANT USAGE ON SCHEMA %s TO %s`, s.Schema, r),
				fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %s TO %s`, s.Schema, r),
				fmt.Sprintf(`GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %s TO %s`, s.Schema, r))
		}
	}
	for _, s := range sets {
		stmts = append(stmts, fmt.Sprintf(`REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON %s.%s FROM %s`, s.Schema, s.VersionTable, r))
		for _, t := range s.AppendOnly {
			stmts = append(stmts, fmt.Sprintf(`REVOKE UPDATE, DELETE, TRUNCATE ON %s.%s FROM %s`, s.Schema, t, r))
		}
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("grant to %s: %s: %w", role, q, err)
		}
	}
	return tx.Commit()
}

// GrantDSN is Grant on a database opened from dsn for the duration of the call.
func GrantDSN(ctx context.Context, dsn, role string, sets ...Set) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	return Grant(ctx, db, role, sets...)
}

const qRole = `SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1), $1 = current_user`
