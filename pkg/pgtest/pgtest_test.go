package pgtest_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

var testSet = pgmigrate.Set{Name: "test", FS: fstest.MapFS{
	"00001_t.sql": {Data: []byte("-- +goose Up\nCREATE TABLE t (id int);\n-- +goose Down\nDROP TABLE t;\n")},
}}

// TestMain passes the parent's server to a child process of this binary
// (TestChildProcessUsesTheParentsServer): the environment is the only channel
// into a re-executed test binary, so this test file, not pgtest, reads it.
func TestMain(m *testing.M) {
	os.Exit(pgtest.MainWith(m, pgtest.Options{ServerDSN: os.Getenv(pgtest.EnvServer)}))
}

// envChildPort, set by TestChildProcessUsesTheParentsServer only, is the port
// of the parent's server, which the child's database must be on.
const envChildPort = "PGTEST_TEST_CHILD_PORT"

// TestChildProcessUsesTheParentsServer re-executes the test binary, as the
// workers of `go test -fuzz` are, and checks that the child's database is on
// the parent's server (EnvServer), not on a cluster of the child's own.
func TestChildProcessUsesTheParentsServer(t *testing.T) {
	ctx := context.Background()
	if want := os.Getenv(envChildPort); want != "" {
		var port int
		if err := pgtest.NewPool(t, testSet).QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port); err != nil {
			t.Fatal(err)
		}
		if strconv.Itoa(port) != want {
			t.Fatalf("child database on port %d, want the parent's server on %s", port, want)
		}
		return
	}
	u, err := url.Parse(pgtest.ServerDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv(pgtest.EnvServer) == "" {
		t.Fatalf("%s not set once the server is known", pgtest.EnvServer)
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChildProcessUsesTheParentsServer$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envChildPort+"="+u.Port())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestChildProcessUsesTheParentsServer") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func TestDatabasesAreIsolated(t *testing.T) {
	t.Parallel()
	a := pgtest.NewPool(t, testSet)
	b := pgtest.NewPool(t, testSet)
	ctx := context.Background()
	if _, err := a.Exec(ctx, "CREATE TABLE only_in_a (id int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("table created in database a is visible in database b")
	}
	var v int64
	if err := b.QueryRow(ctx, "SELECT max(version_id) FROM goose_db_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v < 1 {
		t.Fatalf("migrations not applied: version %d", v)
	}
}

func ExampleExampleDatabase() {
	dsn, drop := pgtest.ExampleDatabase(testSet)
	defer drop()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM t`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("rows:", n)
	// Output: rows: 0
}

// A transaction of two statements is four round trips (BEGIN, two
// statements, COMMIT) and one commit; a batch of three statements is one
// round trip and one commit (an implicit transaction); a rolled-back
// transaction commits nothing.
func TestCountingPool_CountsStatementsAndBatchesAsRoundTrips(t *testing.T) {
	ctx := context.Background()
	pool, rt := pgtest.NewCountingPool(t, testSet)
	warm := func() {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT 2`)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	warm() // statements prepared and cached
	rt.Reset()
	warm()
	if got, commits := rt.Load(), rt.Commits(); got != 4 || commits != 1 {
		t.Errorf("transaction of two statements: %d round trips and %d commits, want 4 and 1", got, commits)
	}
	rt.Reset()
	b := &pgx.Batch{}
	b.Queue(`SELECT 1`)
	b.Queue(`SELECT 2`)
	b.Queue(`SELECT 3`)
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if got, commits := rt.Load(), rt.Commits(); got != 1 || commits != 1 {
		t.Errorf("batch of three statements: %d round trips and %d commits, want 1 and 1", got, commits)
	}
	rt.Reset()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	if got, commits := rt.Load(), rt.Commits(); got != 4 || commits != 1 {
		t.Errorf("rolled-back transaction, then a statement: %d round trips and %d commits, want 4 and 1", got, commits)
	}
}
