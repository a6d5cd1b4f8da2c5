package benchkit

import (
	"os"
	"testing"

	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// The environment of the benchmarks' PostgreSQL server, which pkg/pgtest does
// not read: test binaries with benchmarks pass it on through Main.
const (
	// EnvDatabaseURL, when set, is a superuser postgres:// URL of a running
	// server the benchmarks' databases are created on, instead of an
	// ephemeral cluster.
	EnvDatabaseURL = "DATABASE_URL"
	// EnvFsync, set to "on", starts the ephemeral cluster with fsync=on.
	// Benchmarks that compare with pgbench anchors need it (make bench sets it).
	EnvFsync = "LOSSLESS_PG_FSYNC"
	// EnvStatStatements, set to "on", starts the ephemeral cluster with
	// pg_stat_statements preloaded (pgtest.ClusterOptions.StatStatements);
	// make bench sets it, and benchmark B5 reports the statements the server
	// spent its time on.
	EnvStatStatements = "LOSSLESS_PG_STAT_STATEMENTS"
)

// PGTestOptions reads the pgtest server of a benchmark binary from the
// environment: EnvDatabaseURL, else a parent test process's cluster
// (pgtest.EnvServer), else an ephemeral cluster with EnvFsync and
// EnvStatStatements.
func PGTestOptions() pgtest.Options {
	dsn := os.Getenv(EnvDatabaseURL)
	if dsn == "" {
		dsn = os.Getenv(pgtest.EnvServer)
	}
	return pgtest.Options{
		ServerDSN: dsn,
		Cluster: pgtest.ClusterOptions{
			Fsync:          os.Getenv(EnvFsync) == "on",
			StatStatements: os.Getenv(EnvStatStatements) == "on",
		},
	}
}

// Main is pgtest.Main on the server PGTestOptions reads, for the TestMain of
// a package with benchmarks:
//
//	func TestMain(m *testing.M) { os.Exit(benchkit.Main(m)) }
func Main(m *testing.M) int { return pgtest.MainWith(m, PGTestOptions()) }
