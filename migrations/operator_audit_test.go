// The operator audit (pkg/operator) on each service's real schema: the
// operator_audit table is created by the services' migrations, so its tests
// live with them and pkg/ builds and tests on its own.
package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pgdb"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// services are the databases that have an operator_audit table.
var services = map[string]func() []pgmigrate.Set{
	"workorder": migrations.WorkOrder, "billing": migrations.Billing, "providersim": migrations.ProviderSim,
}

func write(t *testing.T, db pgdb.Executor, e operator.AuditEntry) {
	t.Helper()
	if err := operator.WriteAudit(context.Background(), db, e); err != nil {
		t.Fatal(err)
	}
}

func tickets(rs []operator.AuditRecord) (out []string) {
	for _, r := range rs {
		out = append(out, r.Ticket)
	}
	return out
}

// Every service's table takes a write and answer every filter, newest
// first, in pages.
func TestWriteAndList(t *testing.T) {
	t.Parallel()
	for name, sets := range services {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.NewPool(t, sets()...)
			write(t, pool, operator.AuditEntry{Action: "parked.replay", Actor: " alice ", Ticket: "\tINC-1 ", DryRun: true,
				Params: map[string]any{"parked_id": 7, "outcome": "enqueued"}, Affected: 1})
			write(t, pool, operator.AuditEntry{Action: "jobs.retry", Actor: "bob", Ticket: "INC-2", Affected: 3})
			write(t, pool, operator.AuditEntry{Action: "parked.replay", Actor: "alice", Ticket: "INC-3"})

			all, more, err := operator.ListAudit(ctx, pool, operator.AuditFilter{})
			if err != nil || more {
				t.Fatalf("list: more %v, %v", more, err)
			}
			if got := strings.Join(tickets(all), ","); got != "INC-3,INC-2,INC-1" {
				t.Fatalf("newest first: %s", got)
			}
			first := all[2]
			if first.Actor != "alice" || first.Ticket != "INC-1" || !first.DryRun || first.Affected != 1 ||
				first.Action != "parked.replay" || first.Params["parked_id"] != float64(7) || first.Params["outcome"] != "enqueued" ||
				first.OccurredAt.IsZero() || first.ID <= 0 {
				t.Fatalf("stored row, trimmed: %+v", first)
			}
			if all[1].DryRun || all[1].Affected != 3 {
				t.Fatalf("second row: %+v", all[1])
			}

			for f, want := range map[operator.AuditFilter]string{
				{Action: "parked.replay"}:                  "INC-3,INC-1",
				{Actor: "alice"}:                           "INC-3,INC-1",
				{Ticket: "INC-2"}:                          "INC-2",
				{Action: "parked.replay", Ticket: "INC-1"}: "INC-1",
				{Actor: "mallory"}:                         "",
				{BeforeID: all[0].ID}:                      "INC-2,INC-1",
				{Actor: "alice", BeforeID: all[0].ID}:      "INC-1",
			} {
				got, more, err := operator.ListAudit(ctx, pool, f)
				if err != nil || more || strings.Join(tickets(got), ",") != want {
					t.Errorf("%+v: %v (more %v), %v; want %s", f, tickets(got), more, err, want)
				}
			}

			// Paging: each page's last id is the next one's BeforeID.
			var paged []string
			f := operator.AuditFilter{Limit: 2}
			for page := 0; ; page++ {
				got, more, err := operator.ListAudit(ctx, pool, f)
				if err != nil || page > 2 {
					t.Fatalf("page %d: %v", page, err)
				}
				paged = append(paged, tickets(got)...)
				if !more {
					break
				}
				f.BeforeID = got[len(got)-1].ID
			}
			if got := strings.Join(paged, ","); got != "INC-3,INC-2,INC-1" {
				t.Fatalf("pages: %s", got)
			}
		})
	}
}

// Limit 0 means DefaultLimit; a limit or position out of range is refused.
func TestListLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, migrations.Billing()...)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := range operator.DefaultAuditLimit + 1 {
			if err := operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "jobs.retry", Actor: "alice", Ticket: fmt.Sprint("INC-", i)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, more, err := operator.ListAudit(ctx, pool, operator.AuditFilter{})
	if err != nil || len(got) != operator.DefaultAuditLimit || !more {
		t.Fatalf("default limit: %d rows, more %v, %v", len(got), more, err)
	}
	if got, more, err := operator.ListAudit(ctx, pool, operator.AuditFilter{Limit: operator.MaxAuditLimit}); err != nil || len(got) != operator.DefaultAuditLimit+1 || more {
		t.Fatalf("max limit: %d rows, more %v, %v", len(got), more, err)
	}
	for _, f := range []operator.AuditFilter{{Limit: -1}, {Limit: operator.MaxAuditLimit + 1}, {BeforeID: -1}} {
		if _, _, err := operator.ListAudit(ctx, pool, f); !errors.Is(err, operator.ErrInvalidAuditFilter) {
			t.Errorf("%+v: %v, want ErrInvalidFilter", f, err)
		}
	}
}

func count(t *testing.T, pool *pgxpool.Pool, table string) (n int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// An entry without an action, or a ticket or actor the table would refuse,
// is refused before the database and writes nothing; 200 characters of
// two bytes each are within the CHECK, which counts characters.
func TestWriteRefusesAnIncompleteEntry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, migrations.WorkOrder()...)
	valid := operator.AuditEntry{Action: "jobs.retry", Actor: "alice", Ticket: "INC-1"}
	for name, c := range map[string]struct {
		mutate func(*operator.AuditEntry)
		field  string
	}{
		"no ticket":        {func(e *operator.AuditEntry) { e.Ticket = "" }, "ticket is required"},
		"blank actor":      {func(e *operator.AuditEntry) { e.Actor = " \t" }, "actor is required"},
		"no action":        {func(e *operator.AuditEntry) { e.Action = " " }, "action is required"},
		"ticket too long":  {func(e *operator.AuditEntry) { e.Ticket = strings.Repeat("é", operator.MaxAuditLength+1) }, "ticket must be at most"},
		"NUL in the actor": {func(e *operator.AuditEntry) { e.Actor = "al\x00ice" }, "actor"},
	} {
		e := valid
		c.mutate(&e)
		if err := operator.WriteAudit(ctx, pool, e); !errors.Is(err, operator.ErrInvalidAuditEntry) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want ErrInvalidEntry naming %q", name, err, c.field)
		}
	}
	if n := count(t, pool, "operator_audit"); n != 0 {
		t.Fatalf("%d rows written by refused entries", n)
	}
	long := valid
	long.Ticket = strings.Repeat("é", operator.MaxAuditLength)
	write(t, pool, long)
	if n := count(t, pool, "operator_audit"); n != 1 {
		t.Fatalf("a %d-character ticket: %d rows", operator.MaxAuditLength, n)
	}
}

// The shape every caller of InSavepoint has: the effect under the
// savepoint, then the audit row in the outer transaction.
func replay(ctx context.Context, pool *pgxpool.Pool, dryRun bool, effect func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := operator.InSavepoint(ctx, tx, dryRun, effect); err != nil {
			return err
		}
		return operator.WriteAudit(ctx, tx, operator.AuditEntry{Action: "parked.replay", Actor: "alice", Ticket: "INC-1", DryRun: dryRun, Affected: 1})
	})
}

// A dry run rolls the effect back and commits the audit row; a real run
// commits both; a failing effect, even one that aborted the transaction
// with an SQL error, rolls back both.
func TestInSavepoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, migrations.Billing()...)
	if _, err := pool.Exec(ctx, "CREATE TABLE effect (n int)"); err != nil {
		t.Fatal(err)
	}
	insert := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO effect VALUES (1)")
		return err
	}
	state := func() string {
		return fmt.Sprintf("effect %d, audit %d", count(t, pool, "effect"), count(t, pool, "operator_audit"))
	}

	if err := replay(ctx, pool, true, insert); err != nil {
		t.Fatal(err)
	}
	if got := state(); got != "effect 0, audit 1" {
		t.Fatalf("dry run: %s", got)
	}
	if recs, _, err := operator.ListAudit(ctx, pool, operator.AuditFilter{}); err != nil || !recs[0].DryRun {
		t.Fatalf("dry run audited as such: %+v, %v", recs, err)
	}

	if err := replay(ctx, pool, false, insert); err != nil {
		t.Fatal(err)
	}
	if got := state(); got != "effect 1, audit 2" {
		t.Fatalf("real run: %s", got)
	}

	refused := errors.New("still refused")
	for name, effect := range map[string]func(pgx.Tx) error{
		"error": func(tx pgx.Tx) error {
			if err := insert(tx); err != nil {
				return err
			}
			return refused
		},
		"SQL error": func(tx pgx.Tx) error {
			if err := insert(tx); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT 1/0")
			return err
		},
	} {
		for _, dryRun := range []bool{false, true} {
			if err := replay(ctx, pool, dryRun, effect); err == nil {
				t.Fatalf("%s (dry run %v): no error", name, dryRun)
			}
			if got := state(); got != "effect 1, audit 2" {
				t.Fatalf("%s (dry run %v): %s", name, dryRun, got)
			}
		}
	}
	if err := replay(ctx, pool, false, func(pgx.Tx) error { return refused }); !errors.Is(err, refused) {
		t.Fatalf("the effect's error is returned as it is: %v", err)
	}
}

// column is one column of operator_audit as information_schema describes it.
type column struct {
	Name, Type, Nullable, Default, Identity string
	Position                                int
}

// shape is operator_audit's columns and constraints in the public schema of
// a database migrated with sets.
func shape(t *testing.T, sets []pgmigrate.Set) (cols []column, constraints []string) {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.NewPool(t, sets...)
	rows, err := pool.Query(ctx, `
SELECT column_name, data_type, is_nullable, coalesce(column_default, ''), is_identity, ordinal_position
FROM information_schema.columns
WHERE table_schema = 'public' AND table_name = 'operator_audit'
ORDER BY ordinal_position`)
	if err != nil {
		t.Fatal(err)
	}
	cols, err = pgx.CollectRows(rows, pgx.RowToStructByPos[column])
	if err != nil {
		t.Fatal(err)
	}
	// The CHECKs bound what Write accepts (MaxLength); the identity is what
	// List pages by.
	rows, err = pool.Query(ctx, `
SELECT contype::text || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint
WHERE conrelid = 'public.operator_audit'::regclass
ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	constraints, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return cols, constraints
}

// The package assumes one operator_audit shape: every service's
// migrations must create the same table as the work-order service's.
func TestServicesHaveOneOperatorAuditShape(t *testing.T) {
	t.Parallel()
	woCols, woCons := shape(t, migrations.WorkOrder())
	if len(woCols) == 0 || len(woCons) == 0 {
		t.Fatalf("workorder: operator_audit has columns %v, constraints %v", woCols, woCons)
	}
	for name, sets := range services {
		if name == "workorder" {
			continue
		}
		cols, cons := shape(t, sets())
		if fmt.Sprint(woCols) != fmt.Sprint(cols) {
			t.Errorf("columns differ:\nworkorder %v\n%-9s %v", woCols, name, cols)
		}
		if strings.Join(woCons, "\n") != strings.Join(cons, "\n") {
			t.Errorf("constraints differ:\nworkorder %q\n%-9s %q", woCons, name, cons)
		}
	}
}
