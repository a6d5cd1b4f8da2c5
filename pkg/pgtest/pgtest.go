// Package pgtest gives each test its own migrated database on a real
// PostgreSQL server, chosen by the Options its TestMain passes:
//
//   - by default, one ephemeral cluster per test binary, started lazily from
//     the local PostgreSQL binaries (StartCluster) and stopped by Main;
//   - with Options.ServerDSN, on that running server.
//
// Each database is cloned from a template that is migrated once per migration
// set (peterldowns/pgtestdb), so a new database costs ~0.1–0.4 s, not a full
// migration run. Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// Lesson: a test of a database pattern proves nothing against a fake; locks,
// SKIP LOCKED, unique keys and SQLSTATEs only exist on the real server. It
// guards no failure mode itself: it is where the tests of F1–F16, H1–H10 and
// I1–I7 in pkg/ run (StartCluster also lets a test stop and restart its own
// server, as F15's does), and where the network rows N1–N6 get their
// half-open connections: StallProxy stalls any TCP client on loopback, a
// database pool (StallDSN) or a gRPC or Pub/Sub channel.
//
// pgtest reads no environment variable: a test binary that wants an external
// server or the cluster's knobs (fsync, pg_stat_statements: the benchmarks)
// reads them itself and calls MainWith (internal/testkit/benchkit.PGTestOptions does,
// for the benchmarks). One variable crosses processes: once the ephemeral
// cluster runs, pgtest sets EnvServer to its DSN, so that the test binary's
// own child processes (the workers of `go test -fuzz`, a test that re-executes
// the binary) inherit it. The environment is the only channel into such a
// child; its TestMain reads EnvServer and passes it as ServerDSN, and then
// uses its parent's server instead of starting, and when the parent stops it
// orphaning, a cluster of its own.
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/peterldowns/pgtestdb"
	"github.com/peterldowns/pgtestdb/migrators/common"

	"github.com/lossless-dev/lossless/pkg/pgmigrate"
)

// EnvServer is the variable through which the ephemeral cluster is handed to
// this test binary's child processes: Main's cluster sets it to its DSN; a
// child's TestMain passes its value as Options.ServerDSN (package doc).
const EnvServer = "LOSSLESS_PGTEST_SERVER"

// Options configure the server a test binary's databases live on. The zero
// value starts one ephemeral cluster with ClusterOptions' defaults.
type Options struct {
	// ServerDSN is a superuser postgres:// URL of a running server on which
	// each test's database is created and dropped (a CI service, a parent
	// test process's cluster via EnvServer). Default "": an ephemeral
	// cluster, started when a test first asks for a database.
	ServerDSN string
	// Cluster configures that ephemeral cluster (Fsync, StatStatements for
	// the benchmarks). Ignored with ServerDSN.
	Cluster ClusterOptions
}

// shared is the per-test-binary server. Package state is deliberate here: a
// test binary has exactly one lifetime, and Main bounds it.
var shared struct {
	mu      sync.Mutex
	main    bool
	opts    Options
	cluster *Cluster
	base    pgtestdb.Config
	err     error
	started bool
}

// Main runs the tests on an ephemeral cluster with the default options
// (MainWith with zero Options) and stops the cluster, if one was started.
// Every package that uses pgtest calls Main or MainWith from TestMain.
func Main(m *testing.M) int { return MainWith(m, Options{}) }

// MainWith is Main with the server chosen by opts.
func MainWith(m *testing.M, opts Options) int {
	shared.mu.Lock()
	shared.main, shared.opts = true, opts
	shared.mu.Unlock()
	code := m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster != nil {
		shared.cluster.Remove()
		shared.cluster = nil
	}
	return code
}

// NewPool returns a pool on a new database migrated with the sets, in order
// (a pattern package's tests pass its own Migrations; a service's pass
// migrations.<Service>()...). The database and pool are dropped when the test
// ends.
func NewPool(t testing.TB, sets ...pgmigrate.Set) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), NewDatabase(t, sets...))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// NewDatabase returns the connection string of a new database migrated with
// the sets, for code under test that opens its own connections.
func NewDatabase(t testing.TB, sets ...pgmigrate.Set) string {
	t.Helper()
	if len(sets) == 0 {
		t.Fatal("pgtest: no migration sets")
	}
	base, err := server()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	conf := pgtestdb.Custom(t, base, migrator{sets: sets})
	return conf.URL()
}

// ExampleDatabase is NewDatabase for runnable Example functions, which have
// no testing.TB: it returns the database's connection string and a drop
// function to defer. A failure panics, which fails the Example with the
// message. The package's TestMain must call Main, as for tests.
func ExampleDatabase(sets ...pgmigrate.Set) (dsn string, drop func()) {
	if len(sets) == 0 {
		panic("pgtest: no migration sets")
	}
	base, err := server()
	if err != nil {
		panic(fmt.Sprintf("pgtest: %v", err))
	}
	tb := &exampleTB{}
	conf := pgtestdb.Custom(tb, base, migrator{sets: sets})
	return conf.URL(), tb.cleanup
}

// exampleTB is the part of testing.TB that pgtestdb uses.
type exampleTB struct{ cleanups []func() }

func (e *exampleTB) Cleanup(f func())               { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Failed() bool                   { return false }
func (e *exampleTB) Fatalf(format string, a ...any) { panic(fmt.Sprintf("pgtest: "+format, a...)) }
func (e *exampleTB) Helper()                        {}
func (e *exampleTB) Logf(string, ...any)            {}

func (e *exampleTB) cleanup() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

// ServerDSN returns a superuser connection string to the test server's
// "postgres" database, for tests that create their own objects.
func ServerDSN(t testing.TB) string {
	t.Helper()
	base, err := server()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return base.URL()
}

// Checkpoint flushes the test server's dirty pages, so that a benchmark
// measurement does not pay for the writes of the one before it (the shared
// anchor scripts do the same). It needs the superuser of ServerDSN.
func Checkpoint(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, ServerDSN(t))
	if err != nil {
		t.Fatalf("pgtest: checkpoint: %v", err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
		t.Fatalf("pgtest: checkpoint: %v", err)
	}
}

func server() (pgtestdb.Config, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.started {
		return shared.base, shared.err
	}
	shared.started = true
	if !shared.main {
		shared.err = fmt.Errorf("TestMain does not call pgtest.Main, which chooses the server and stops the ephemeral cluster: add `func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }`")
		return shared.base, shared.err
	}
	if dsn := shared.opts.ServerDSN; dsn != "" {
		shared.base, shared.err = configFromURL(dsn)
		return shared.base, shared.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, shared.opts.Cluster)
	if err != nil {
		shared.err = fmt.Errorf("start an ephemeral PostgreSQL cluster: %w", err)
		return shared.base, shared.err
	}
	shared.cluster = c
	shared.base, shared.err = configFromURL(c.DSN("postgres"))
	if shared.err == nil {
		shared.err = os.Setenv(EnvServer, c.DSN("postgres"))
	}
	return shared.base, shared.err
}

func configFromURL(dsn string) (pgtestdb.Config, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return pgtestdb.Config{}, fmt.Errorf("the server DSN must be a postgres:// URL, got %q", dsn)
	}
	pw, _ := u.User.Password()
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	opts := u.Query()
	if opts.Get("sslmode") == "" {
		opts.Set("sslmode", "disable")
	}
	return pgtestdb.Config{
		DriverName: "pgx",
		Host:       u.Hostname(),
		Port:       port,
		User:       u.User.Username(),
		Password:   pw,
		Database:   strings.TrimPrefix(u.Path, "/"),
		Options:    opts.Encode(),
		// Tests may leave LISTEN connections or a stopped relay's sessions open.
		ForceTerminateConnections: true,
	}, nil
}

// migrator adapts pgmigrate to pgtestdb: the template is keyed by a hash of
// every set's identity and files, so a changed migration (or schema) builds a
// new template.
type migrator struct{ sets []pgmigrate.Set }

func (m migrator) Hash() (string, error) {
	h := common.NewRecursiveHash()
	for _, s := range m.sets {
		h.Add([]byte(s.Name + "\x00" + s.Schema + "\x00" + s.VersionTable + "\x00"))
		names, err := fs.Glob(s.FS, "*.sql")
		if err != nil {
			return "", err
		}
		for _, n := range names {
			b, err := fs.ReadFile(s.FS, n)
			if err != nil {
				return "", err
			}
			h.Add([]byte(n))
			h.Add(b)
		}
	}
	return h.String(), nil
}

func (m migrator) Migrate(ctx context.Context, db *sql.DB, _ pgtestdb.Config) error {
	_, err := pgmigrate.Apply(ctx, db, m.sets...)
	return err
}
