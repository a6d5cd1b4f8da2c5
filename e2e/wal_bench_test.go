package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"math"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// Durable cost, counted by the server. A commit of pg_stat_database
// (xact_commit) is any transaction, a read-only one included, which writes
// nothing and flushes nothing. What a durable step costs is a commit record
// in the WAL and the flush that makes it durable, so the benchmarks count
// both over a span, server-wide:
//
//   - write transactions: the commit records between the span's two WAL
//     positions, as pg_waldump --stats=record counts them
//     (Transaction/COMMIT); the read-only transactions are xact_commit minus
//     these;
//   - WAL flushes: pg_stat_wal.wal_sync, the fsyncs of the WAL. Group commit
//     makes one flush cover concurrent commits, so flushes ≤ write
//     transactions under load; a transaction committed with
//     synchronous_commit off has a commit record and waits for no flush.
//
// The span's WAL must still be on disk when it is read: walMark sets
// wal_keep_size so a checkpoint in the span recycles none of it.

// walKeep is the WAL kept past checkpoints while a span is measured: more
// than a benchmark's phase writes.
const walKeep = "4GB"

// walMarkQuery reads the WAL insert position and the flush counters.
const walMarkQuery = `SELECT pg_current_wal_insert_lsn()::text, wal_sync, wal_write FROM pg_stat_wal`

type walMark struct {
	lsn           string
	syncs, writes int64
}

// walCost is the durable cost of a span: its write transactions (commit
// records; -1 when pg_waldump could not read the span) and WAL flushes.
type walCost struct {
	writeXacts, flushes, writes int64
	// shapes: the write transactions by database and tables written
	// (walshape_bench_test.go); nil when they could not be read.
	shapes []walShape
	// wakeUps: the write transactions that are NOTIFYs on their own
	// (walWakeUp); durable: the others, each a step that waited for its
	// flush. Both -1 without shapes.
	wakeUps, durable int64
}

func walMarkNow(ctx context.Context, b testing.TB, server string) walMark {
	b.Helper()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	for _, q := range []string{`ALTER SYSTEM SET wal_keep_size = '` + walKeep + `'`, `SELECT pg_reload_conf()`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	var m walMark
	if err := conn.QueryRow(ctx, walMarkQuery).Scan(&m.lsn, &m.syncs, &m.writes); err != nil {
		b.Fatal(err)
	}
	return m
}

// walSince returns the durable cost from before to now. pg_waldump reads the
// server's pg_wal directly, so the server must be local (the ephemeral
// cluster, or a LOSSLESS_DATABASE_URL server on this machine readable by
// this process); otherwise writeXacts is -1 and the log says why.
func walSince(ctx context.Context, b testing.TB, server string, before walMark) walCost {
	b.Helper()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	// The span's last records written out (pg_waldump reads files), then
	// its end read; the switch costs one flush, outside the span.
	var after walMark
	if err := conn.QueryRow(ctx, walMarkQuery).Scan(&after.lsn, &after.syncs, &after.writes); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_switch_wal()`); err != nil {
		b.Fatal(err)
	}
	c := walCost{writeXacts: -1, wakeUps: -1, durable: -1, flushes: after.syncs - before.syncs, writes: after.writes - before.writes}
	var dataDir string
	if err := conn.QueryRow(ctx, `SHOW data_directory`).Scan(&dataDir); err != nil {
		b.Logf("WAL: data_directory not readable (%v): write transactions not counted", err)
		return c
	}
	tool, err := walDumpPath()
	if err != nil {
		b.Logf("WAL: %v: write transactions not counted", err)
		return c
	}
	out, err := exec.CommandContext(ctx, tool, "--stats=record", "-p", filepath.Join(dataDir, "pg_wal"),
		"-s", before.lsn, "-e", after.lsn).CombinedOutput()
	if err != nil {
		b.Logf("WAL: pg_waldump %s..%s: %v: %s: write transactions not counted", before.lsn, after.lsn, err, bytes.TrimSpace(out))
		return c
	}
	n, ok := walCommitRecords(out)
	if !ok {
		b.Logf("WAL: pg_waldump printed no Transaction/COMMIT line: write transactions not counted:\n%s", out)
		return c
	}
	c.writeXacts = n
	shapes, err := walShapesOf(ctx, server, tool, filepath.Join(dataDir, "pg_wal"), before.lsn, after.lsn)
	if err != nil {
		b.Logf("WAL: write transactions by shape not read: %v", err)
		return c
	}
	c.shapes = shapes
	c.wakeUps = 0
	for _, sh := range shapes {
		if sh.tables == walWakeUp {
			c.wakeUps += sh.n
		}
	}
	c.durable = c.writeXacts - c.wakeUps
	return c
}

// perOrder is n ÷ orders, NaN when n is unknown (-1).
func perOrder(n int64, orders int) float64 {
	if n < 0 {
		return math.NaN()
	}
	return float64(n) / float64(max(orders, 1))
}

// walCommitRecords returns the count of pg_waldump --stats=record's
// Transaction/COMMIT line ("Transaction/COMMIT  1234 ( 12.34) ...").
func walCommitRecords(out []byte) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "Transaction/COMMIT" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// walDumpPath finds pg_waldump: on PATH, else beside Debian's server
// binaries (where pkg/pgtest finds initdb).
func walDumpPath() (string, error) {
	if p, err := exec.LookPath("pg_waldump"); err == nil {
		return p, nil
	}
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_waldump")
	if len(m) == 0 {
		return "", exec.ErrNotFound
	}
	return m[len(m)-1], nil
}

// TestWALCost_CountsWriteTransactionsNotReadOnlyOnes: the benchmarks' durable
// cost counts each committed write once and a read-only transaction not at
// all, from the server's own WAL.
func TestWALCost_CountsWriteTransactionsNotReadOnlyOnes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx := context.Background()
	server := pgtest.ServerDSN(t)
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{fmt.Sprintf("wal_probe_%d", time.Now().UnixNano())}.Sanitize()
	if _, err := conn.Exec(ctx, `CREATE TABLE `+table+` (n int)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := pgx.Connect(context.WithoutCancel(ctx), server); err == nil {
			_, _ = c.Exec(context.WithoutCancel(ctx), `DROP TABLE `+table)
			_ = c.Close(context.WithoutCancel(ctx))
		}
	})
	var fsync, db string
	if err := conn.QueryRow(ctx, `SELECT current_setting('fsync'), current_database()`).Scan(&fsync, &db); err != nil {
		t.Fatal(err)
	}
	before := walMarkNow(ctx, t, server)
	const writes, reads = 20, 50
	for i := range writes {
		if _, err := conn.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, i); err != nil {
			t.Fatal(err)
		}
	}
	for range reads {
		if _, err := conn.Exec(ctx, `SELECT count(*) FROM `+table); err != nil {
			t.Fatal(err)
		}
	}
	// Transactions that only lock a row (a commit record all the same), and
	// ones whose insert is in a subtransaction: the shapes must say which.
	const locks, nested = 3, 2
	for range locks {
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT n FROM `+table+` LIMIT 1 FOR UPDATE`)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Wake-ups as the services send them: a NOTIFY in a transaction of its
	// own, synchronous_commit off (pkg/pgdb's qNotify).
	const wakeUps = 4
	for range wakeUps {
		if _, err := conn.Exec(ctx, `SELECT set_config('synchronous_commit', 'off', true), pg_notify('wal_probe', '')`); err != nil {
			t.Fatal(err)
		}
	}
	// A savepoint rolled back inside a committed transaction: its insert is
	// gone, the transaction's own insert counts.
	const rolledBack = 1
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES (-1)`); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO `+table+` VALUES (-2)`); err != nil {
			return err
		}
		return sp.Rollback(ctx)
	}); err != nil {
		t.Fatal(err)
	}
	for i := range nested {
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { // a savepoint
				_, err := sp.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, writes+i)
				return err
			})
		}); err != nil {
			t.Fatal(err)
		}
	}
	// A backend reports its WAL counters at most once a second, and at its
	// exit: closing it makes the span's flushes visible now (the benchmarks
	// wait their statistics' settle instead).
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	c := walSince(ctx, t, server, before)
	// Other databases of the server may commit meanwhile (the package's
	// tests share it), never fewer: at least the 20, and nowhere near the 70
	// a count of every transaction would give when the server is otherwise idle.
	const durable = writes + locks + nested + rolledBack
	if c.writeXacts < durable+wakeUps {
		t.Fatalf("write transactions %d, want at least the %d that wrote or locked and the %d wake-ups (pg_waldump must read the span)",
			c.writeXacts, durable, wakeUps)
	}
	// By shape: the probe table's, in this database, and nothing else of ours.
	relname := strings.Trim(table, `"`)
	got := map[string]int64{}
	for _, sh := range c.shapes {
		if sh.db == db && strings.Contains(sh.tables, relname) {
			got[sh.tables] += sh.n
		}
	}
	if want := map[string]int64{relname: writes + nested + rolledBack, relname + "(lock)": locks}; !maps.Equal(got, want) {
		t.Fatalf("write transactions on %s by tables written = %v, want %v (all shapes: %v)", relname, got, want, c.shapes)
	}
	// Other tests of the package may notify meanwhile, never fewer.
	if c.wakeUps < wakeUps || c.durable < durable {
		t.Fatalf("wake-ups %d (want at least %d), durable %d of %d write transactions (want at least %d)",
			c.wakeUps, wakeUps, c.durable, c.writeXacts, durable)
	}
	// Without fsync (the tests' default server) the WAL is written, never synced.
	if fsync == "on" && c.flushes < 1 {
		t.Fatalf("WAL flushes %d over %d synchronous commits, want at least 1", c.flushes, writes)
	}
	t.Logf("%d inserts and %d reads: %d write transactions (%d durable, %d wake-ups), %d WAL flushes, %d WAL writes",
		writes, reads, c.writeXacts, c.durable, c.wakeUps, c.flushes, c.writes)
}
