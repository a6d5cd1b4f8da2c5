package pgmigrate_test

import (
	"context"
	"database/sql"
	"io/fs"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func file(up, down string) *fstest.MapFile {
	return &fstest.MapFile{Data: []byte("-- +goose Up\n" + up + "\n-- +goose Down\n" + down + "\n")}
}

// pattern is a pattern package's set: its objects named through {schema}.
func pattern(schema string, files fstest.MapFS) pgmigrate.Set {
	return pgmigrate.Set{Name: "pattern", Schema: schema, FS: files, VersionTable: "pattern_schema_version"}
}

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func version(t *testing.T, db *sql.DB, table string) int64 {
	t.Helper()
	var v int64
	if err := db.QueryRowContext(context.Background(), `SELECT max(version_id) FROM `+table).Scan(&v); err != nil {
		t.Fatalf("read %s: %v", table, err)
	}
	return v
}

// A pattern set lands in its configured schema with its own version table,
// a service set may reference it, and a later migration of the pattern is
// applied alone, without renumbering the service's.
func TestSetsHaveTheirOwnSchemaAndVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v1 := fstest.MapFS{"00001_q.sql": file(`CREATE TABLE {schema}.q (id int PRIMARY KEY);`, `DROP TABLE {schema}.q;`)}
	service := pgmigrate.Set{Name: "service", FS: fstest.MapFS{
		"00001_s.sql": file(`CREATE TABLE s (q_id int REFERENCES alpha.q (id));`, `DROP TABLE s;`),
		"00002_s.sql": file(`ALTER TABLE s ADD COLUMN note text;`, `ALTER TABLE s DROP COLUMN note;`),
	}}
	db := open(t, pgtest.NewDatabase(t, pattern("alpha", v1), service))
	if got := version(t, db, "alpha.pattern_schema_version"); got != 1 {
		t.Fatalf("pattern version %d, want 1", got)
	}
	if got := version(t, db, "public.goose_db_version"); got != 2 {
		t.Fatalf("service version %d, want 2", got)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = 'q'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the pattern's table must live only in its schema (public has %d, err %v)", n, err)
	}

	v2 := fstest.MapFS{"00001_q.sql": v1["00001_q.sql"], "00002_q.sql": file(`ALTER TABLE {schema}.q ADD COLUMN v int;`, `ALTER TABLE {schema}.q DROP COLUMN v;`)}
	applied, err := pgmigrate.Apply(ctx, db, pattern("alpha", v2), service)
	if err != nil {
		t.Fatal(err)
	}
	if applied[0].Version != 2 || applied[1].Version != 2 {
		t.Fatalf("applied %+v, want pattern at 2 and service still at 2", applied)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO alpha.q (id, v) VALUES (1, 1)`); err != nil {
		t.Fatalf("the pattern's second migration did not run: %v", err)
	}
}

// Two migrate runs at once (two migrate Jobs of a rolling deploy) are
// serialised by the session lock: both succeed and the schema is created once.
func TestConcurrentApplyIsSerialised(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	empty := pgmigrate.Set{Name: "empty", FS: fstest.MapFS{"00001_e.sql": file(`SELECT 1;`, `SELECT 1;`)}}
	dsn := pgtest.NewDatabase(t, empty)
	files := fstest.MapFS{}
	for i, name := range []string{"00001_a.sql", "00002_b.sql", "00003_c.sql", "00004_d.sql"} {
		tbl := string(rune('a' + i))
		files[name] = file(`CREATE TABLE {schema}.`+tbl+` (id int); SELECT pg_sleep(0.05);`, `DROP TABLE {schema}.`+tbl+`;`)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				errs[i] = err
				return
			}
			defer db.Close()
			_, errs[i] = pgmigrate.Apply(ctx, db, pattern("beta", files))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("run %d: %v", i, err)
		}
	}
	if got := version(t, open(t, dsn), "beta.pattern_schema_version"); got != 4 {
		t.Fatalf("version %d, want 4", got)
	}
}

func TestInvalidSetsAreRefusedBeforeAnythingRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fsys := fstest.MapFS{"00001_x.sql": file(`CREATE TABLE {schema}.x (id int);`, `DROP TABLE {schema}.x;`)}
	for name, c := range map[string]struct {
		sets []pgmigrate.Set
		want string
	}{
		"bad schema":     {[]pgmigrate.Set{pattern("Alpha", fsys)}, `migration set pattern: schema "Alpha"`},
		"no name":        {[]pgmigrate.Set{{FS: fsys}}, "Name is required"},
		"shared version": {[]pgmigrate.Set{pattern("", fsys), {Name: "other", FS: fsys, VersionTable: "pattern_schema_version"}}, "is used by another set"},
		"none":           {nil, "no migration sets"},
	} {
		// No database is needed: validation runs before the first statement.
		_, err := pgmigrate.Apply(ctx, nil, c.sets...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want it to contain %q", name, err, c.want)
		}
	}
}

// A pattern package's set reads its embedded migrations/ folder, defaults to
// public and names its version table after the package.
func TestPatternSet(t *testing.T) {
	t.Parallel()
	files := fstest.MapFS{"migrations/00001_q.sql": file(`CREATE TABLE {schema}.q (id int);`, `DROP TABLE {schema}.q;`)}
	s := pgmigrate.PatternSet("queue", files, "")
	if s.Name != "queue" || s.Schema != "public" || s.VersionTable != "queue_schema_version" {
		t.Fatalf("set %+v", s)
	}
	if _, err := fs.Stat(s.FS, "00001_q.sql"); err != nil {
		t.Fatalf("the migrations must be at the set's root: %v", err)
	}
	if got := pgmigrate.PatternSet("queue", files, "ops").Schema; got != "ops" {
		t.Fatalf("schema %q, want ops", got)
	}
}
