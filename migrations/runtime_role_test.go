package migrations_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

func sqlstate(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// The runtime role of a service database (DATABASE_RUNTIME_ROLE, granted
// by `migrate`) appends to and reads the audit tables but cannot rewrite or
// remove a row: UPDATE, DELETE and TRUNCATE fail with insufficient_privilege
// (42501), as does moving a migration version or creating a table. The
// service's own tables stay read-write.
func TestRuntimeRoleCannotRewriteTheAudit(t *testing.T) {
	t.Parallel()
	for name, sets := range map[string]func() []pgmigrate.Set{
		"workorder": migrations.WorkOrder, "billing": migrations.Billing, "providersim": migrations.ProviderSim,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			owner := pgtest.NewDatabase(t, sets()...)
			role, dsn := pgtest.RuntimeRole(t, owner, sets()...)
			// Again: migrate grants on every run.
			if err := pgmigrate.GrantDSN(ctx, owner, role, sets()...); err != nil {
				t.Fatal(err)
			}
			rt, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rt.Close(ctx) })
			var appendOnly []string
			for _, s := range sets() {
				appendOnly = append(appendOnly, s.AppendOnly...)
			}
			write(t, rt, operator.AuditEntry{Action: "outbox.requeue", Actor: "hal", Ticket: "INC-1"})
			if rs, _, err := operator.ListAudit(ctx, rt, operator.AuditFilter{}); err != nil || len(rs) != 1 {
				t.Fatalf("runtime role reads the audit: %v %v", rs, err)
			}
			if !slices.Contains(appendOnly, "operator_audit") {
				t.Fatalf("append-only tables %v: want operator_audit", appendOnly)
			}
			// The provider simulator has no pattern package (outbox, inbox, ...).
			if name != "providersim" && len(appendOnly) < 2 {
				t.Fatalf("append-only tables %v: want operator_audit and the pattern packages' audit", appendOnly)
			}
			for _, table := range appendOnly {
				if _, err := rt.Exec(ctx, `SELECT count(*) FROM `+table); err != nil {
					t.Errorf("SELECT %s: %v", table, err)
				}
				for _, q := range []string{
					`UPDATE ` + table + ` SET ` + firstColumn(t, rt, table) + ` = ` + firstColumn(t, rt, table),
					`DELETE FROM ` + table,
					`TRUNCATE ` + table,
				} {
					if _, err := rt.Exec(ctx, q); sqlstate(err) != "42501" {
						t.Errorf("%s as the runtime role: %v, want insufficient_privilege (42501)", q, err)
					}
				}
			}
			for _, q := range []string{
				`INSERT INTO goose_db_version (version_id, is_applied) VALUES (99999, true)`,
				`CREATE TABLE intruder (id int)`,
			} {
				if _, err := rt.Exec(ctx, q); sqlstate(err) != "42501" {
					t.Errorf("%s as the runtime role: %v, want insufficient_privilege (42501)", q, err)
				}
			}
			// Read-write tables: the privilege check runs whatever the rows.
			table := map[string]string{"workorder": "work_orders", "billing": "invoices", "providersim": "jobs"}[name]
			for _, q := range []string{`UPDATE ` + table + ` SET ` + firstColumn(t, rt, table) + ` = ` + firstColumn(t, rt, table) + ` WHERE false`,
				`DELETE FROM ` + table + ` WHERE false`} {
				if _, err := rt.Exec(ctx, q); err != nil {
					t.Errorf("%s as the runtime role: %v", q, err)
				}
			}
		})
	}
}

// firstColumn is the first column an UPDATE may set (not an identity or
// generated one, which fail before the privilege check).
func firstColumn(t *testing.T, c *pgx.Conn, table string) string {
	t.Helper()
	var col string
	if err := c.QueryRow(context.Background(), `SELECT attname FROM pg_attribute
		  WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attidentity = '' AND attgenerated = ''
		  ORDER BY attnum LIMIT 1`, table).Scan(&col); err != nil {
		t.Fatal(err)
	}
	return col
}

// Grant refuses the migration role itself (it owns the tables and would keep
// every privilege) and a role that does not exist, naming it.
func TestGrantRefusesTheOwnerAndAMissingRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner := pgtest.NewDatabase(t, migrations.ProviderSim()...)
	u, _ := url.Parse(owner)
	if err := pgmigrate.GrantDSN(ctx, owner, u.User.Username(), migrations.ProviderSim()...); err == nil || !strings.Contains(err.Error(), "migration role itself") {
		t.Fatalf("grant to the owner: %v", err)
	}
	if err := pgmigrate.GrantDSN(ctx, owner, "no_such_role", migrations.ProviderSim()...); err == nil || !strings.Contains(err.Error(), "no_such_role") {
		t.Fatalf("grant to a missing role: %v", err)
	}
}

// `<service> migrate` (libenv.Migrate) grants the role DATABASE_RUNTIME_ROLE
// names, after migrating as DATABASE_URL's owner.
func TestMigrateGrantsTheRuntimeRoleFromTheEnvironment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner := pgtest.NewDatabase(t, migrations.Billing()...)
	role, dsn := pgtest.RuntimeRole(t, owner, migrations.Billing()...)
	oc, err := pgx.Connect(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = oc.Close(ctx) })
	if _, err := oc.Exec(ctx, `REVOKE ALL ON ALL TABLES IN SCHEMA public FROM `+role); err != nil {
		t.Fatal(err)
	}
	rt, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(ctx) })
	entry := operator.AuditEntry{Action: "outbox.requeue", Actor: "hal", Ticket: "INC-2"}
	if err := operator.WriteAudit(ctx, rt, entry); sqlstate(err) != "42501" {
		t.Fatalf("audit write before migrate granted: %v, want 42501", err)
	}
	env := envconfig.FromMap(map[string]string{"DATABASE_URL": owner, libenv.EnvRuntimeRole: role})
	if err := libenv.Migrate(ctx, env, slog.New(slog.DiscardHandler), migrations.Billing()...); err != nil {
		t.Fatal(err)
	}
	write(t, rt, entry)
	if _, err := rt.Exec(ctx, `DELETE FROM operator_audit`); sqlstate(err) != "42501" {
		t.Fatalf("DELETE after migrate: %v, want 42501", err)
	}
}
