package pgtest_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

var testSet = pgmigrate.Set{Name: "test", FS: fstest.MapFS{
	"00001_t.sql": {Data: []byte("-- +goose Up\nCREATE TABLE t (id int);\n-- +goose Down\nDROP TABLE t;\n")},
}}

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

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
