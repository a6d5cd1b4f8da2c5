package benchkit

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// Setting is one server setting a sustained benchmark fixes.
type Setting struct{ Name, Value string }

// PinnedSettings are the settings that decide when the server writes a
// checkpoint or vacuums, which a drain of minutes otherwise runs into at a
// time that differs from run to run: a checkpoint forced by max_wal_size
// (1GB by default, a few seconds of a drain) makes every page's next change
// write a full-page image, and the rate dips by a third until it passes.
// With these, the only checkpoint is the one Settle runs before the timed
// window, and autovacuum runs as PostgreSQL's defaults have it, checking
// every table every naptime (its thresholds are printed with them).
var PinnedSettings = []Setting{
	{"checkpoint_timeout", "30min"},
	{"max_wal_size", "32GB"},
	{"min_wal_size", "1GB"},
	{"checkpoint_completion_target", "0.9"},
	{"autovacuum", "on"},
	{"autovacuum_naptime", "10s"},
}

// printedSettings are PinnedSettings and the autovacuum thresholds left at
// PostgreSQL's defaults, as PinServer reports them.
var printedSettings = []string{
	"checkpoint_timeout", "max_wal_size", "min_wal_size", "checkpoint_completion_target",
	"autovacuum", "autovacuum_naptime", "autovacuum_vacuum_scale_factor", "autovacuum_vacuum_insert_scale_factor",
	"autovacuum_vacuum_cost_limit", "autovacuum_vacuum_cost_delay", "shared_buffers", "fsync", "synchronous_commit", "track_commit_timestamp",
}

// PinServer sets PinnedSettings on the benchmark's server (ALTER SYSTEM and a
// reload, as its superuser: they need no restart) and returns them as
// PostgreSQL reports them, name=value, for the benchmark's log. On a server
// of the caller's (EnvDatabaseURL) it changes nothing and only reports:
// ALTER SYSTEM would outlive the benchmark.
func PinServer(tb testing.TB) string {
	tb.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.ServerDSN(tb))
	if err != nil {
		tb.Fatal(err)
	}
	defer pool.Close()
	pinned := os.Getenv(EnvDatabaseURL) == ""
	if pinned {
		for _, s := range PinnedSettings {
			exec(tb, pool, fmt.Sprintf(`ALTER SYSTEM SET %s = '%s'`, pgx.Identifier{s.Name}.Sanitize(), s.Value))
		}
		exec(tb, pool, `SELECT pg_reload_conf()`)
		// The reload reaches this session's next statement; wait until it shows.
		want := PinnedSettings[0]
		if !waitfor.Until(10*time.Second, func() bool { return current(tb, pool, want.Name) == want.Value }) {
			tb.Fatalf("benchkit: %s is %s after reload, want %s", want.Name, current(tb, pool, want.Name), want.Value)
		}
	}
	rows, err := pool.Query(ctx, `SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name = ANY($1) ORDER BY name`, printedSettings)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			tb.Fatal(err)
		}
		out = append(out, name+"="+value)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	state := "pinned"
	if !pinned {
		state = "not pinned (" + EnvDatabaseURL + " server)"
	}
	return "server settings " + state + ": " + strings.Join(out, " ")
}

func current(tb testing.TB, pool *pgxpool.Pool, name string) string {
	tb.Helper()
	var v string
	if err := pool.QueryRow(context.Background(), `SELECT current_setting($1)`, name).Scan(&v); err != nil {
		tb.Fatal(err)
	}
	return v
}

// PinTable sets storage parameters on a table of the benchmark's own
// database (ALTER TABLE ... SET, which a DATABASE_URL server keeps only as
// long as the benchmark's database) and returns the table's reloptions as
// PostgreSQL reports them, for the benchmark's log: "outbox
// (autovacuum_vacuum_threshold=300000 ...)".
func PinTable(tb testing.TB, pool *pgxpool.Pool, table string, params ...Setting) string {
	tb.Helper()
	set := make([]string, len(params))
	for i, p := range params {
		set[i] = p.Name + " = " + p.Value
	}
	exec(tb, pool, `ALTER TABLE `+pgx.Identifier{table}.Sanitize()+` SET (`+strings.Join(set, ", ")+`)`)
	var opts []string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, table).Scan(&opts); err != nil {
		tb.Fatal(err)
	}
	return table + " (" + strings.Join(opts, " ") + ")"
}

// Settle vacuums and analyzes the tables, then checkpoints: the timed window
// that follows starts with no dead rows left for autovacuum and the WAL
// budget of PinnedSettings ahead of it.
func Settle(tb testing.TB, pool *pgxpool.Pool, tables ...string) {
	tb.Helper()
	for _, t := range tables {
		exec(tb, pool, `VACUUM ANALYZE `+pgx.Identifier{t}.Sanitize())
	}
	pgtest.Checkpoint(tb)
}

// WaitCount polls q, a count of committed rows, until it reaches n, failing
// the benchmark after timeout, and returns when it did. The benchmarks stop
// their clocks on it: work is done when its outcome is committed, not when
// its handler returned. Call it once the handlers have run, so that the
// polls do not compete with the work measured; poll bounds the resolution.
func WaitCount(tb testing.TB, pool *pgxpool.Pool, q string, n int, poll, timeout time.Duration) time.Time {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		var got int
		if err := pool.QueryRow(context.Background(), q).Scan(&got); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
		if got >= n {
			return time.Now()
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d committed after %v: %s", got, n, timeout, q)
		}
		<-tick.C
	}
}

// Activity is what the server did that a timed window runs into:
// checkpoints (by timeout and requested, max_wal_size's included), WAL
// written, and a table's vacuums and analyzes. Take one before and one after
// the window; Since says what happened in between.
type Activity struct {
	checkpointsTimed, checkpointsReq int64
	walLSN                           string
	vacuums, autovacuums             int64
	autoanalyzes                     int64
	table                            string
	pool                             *pgxpool.Pool
}

// qActivity reads pg_stat_bgwriter (PostgreSQL 15 keeps the checkpoint
// counts there) and the table's row of pg_stat_user_tables, which the
// statistics collector updates within its own delay: a vacuum that ended in
// the last moment may not show yet.
const qActivity = `
SELECT b.checkpoints_timed, b.checkpoints_req, pg_current_wal_lsn()::text,
       coalesce(t.vacuum_count, 0), coalesce(t.autovacuum_count, 0), coalesce(t.autoanalyze_count, 0)
FROM pg_stat_bgwriter b LEFT JOIN pg_stat_user_tables t ON t.relname = $1`

// TakeActivity reads the server's activity counters and table's.
func TakeActivity(tb testing.TB, pool *pgxpool.Pool, table string) Activity {
	tb.Helper()
	a := Activity{table: table, pool: pool}
	if err := pool.QueryRow(context.Background(), qActivity, table).Scan(
		&a.checkpointsTimed, &a.checkpointsReq, &a.walLSN, &a.vacuums, &a.autovacuums, &a.autoanalyzes); err != nil {
		tb.Fatal(err)
	}
	return a
}

// Since renders what happened between a and now: "checkpoints=1 (0 timed, 1
// requested) wal=812MB outbox: autovacuums=2 autoanalyzes=1".
func (a Activity) Since(tb testing.TB) string {
	tb.Helper()
	now := TakeActivity(tb, a.pool, a.table)
	var walBytes int64
	if err := a.pool.QueryRow(context.Background(), `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, now.walLSN, a.walLSN).Scan(&walBytes); err != nil {
		tb.Fatal(err)
	}
	timed, req := now.checkpointsTimed-a.checkpointsTimed, now.checkpointsReq-a.checkpointsReq
	return fmt.Sprintf("checkpoints=%d (%d timed, %d requested) wal=%dMB %s: vacuums=%d autovacuums=%d autoanalyzes=%d",
		timed+req, timed, req, walBytes>>20, a.table, now.vacuums-a.vacuums, now.autovacuums-a.autovacuums, now.autoanalyzes-a.autoanalyzes)
}
