package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/devtools/localstack"
)

// B5 splits the machine's CPU time during the capacity probe by process, so
// that the capacity ratio can be read against where the time went: the
// commit-bound limit assumes PostgreSQL has both cores, while in B5 it shares
// them with the services, the emulator and the load generator.

// b5CPUProcs are the stack's processes B5 charges CPU time to by name.
var b5CPUProcs = []string{"workorder", "billing", "provider-sim", "console", "pubsub-emulator"}

const (
	b5CPUPostgres = "postgres"   // every backend and background process of the server
	b5CPUBench    = "load+bench" // this process: the load generator and the benchmark's reads
	b5CPUMachine  = "machine"    // every CPU of the machine, busy time
	b5CPUOther    = "other"      // machine minus the named groups: the kernel, other work
	b5UserHZ      = 100          // clock ticks per second of /proc (USER_HZ, 100 on every Linux build Go supports)
	b5TickNanos   = int64(time.Second) / b5UserHZ
)

// b5PgPids lists the server's processes: client backends and the
// background ones (walwriter, checkpointer, autovacuum) all appear.
const b5PgPids = `SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL`

// b5CPUSample is CPU time consumed so far: per group, and per PostgreSQL
// pid (backends come and go; a delta counts only pids seen at the end).
type b5CPUSample struct {
	at     time.Time
	groups map[string]time.Duration
	pg     map[int]time.Duration
}

func b5CPUNow(ctx context.Context, b *testing.B, stack *localstack.Stack, pool *pgxpool.Pool) b5CPUSample {
	b.Helper()
	s := b5CPUSample{at: time.Now(), groups: map[string]time.Duration{}, pg: map[int]time.Duration{}}
	for _, name := range b5CPUProcs {
		p := stack.Process(name)
		if p == nil {
			continue
		}
		if t, err := b5ProcCPU(p.Pid()); err == nil {
			s.groups[name] = t
		}
	}
	if t, err := b5ProcCPU(os.Getpid()); err == nil {
		s.groups[b5CPUBench] = t
	}
	rows, err := pool.Query(ctx, b5PgPids)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			b.Fatal(err)
		}
		if t, err := b5ProcCPU(pid); err == nil { // a backend may exit meanwhile
			s.pg[pid] = t
		}
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	t, err := b5MachineCPU()
	if err != nil {
		b.Fatal(err)
	}
	s.groups[b5CPUMachine] = t
	return s
}

// b5CPUDelta is the CPU time each group spent between two samples, with
// "other" the machine's busy time no group accounts for. A PostgreSQL
// backend that started in between counts from zero; one that exited is
// lost (its share shows up in "other").
func b5CPUDelta(from, to b5CPUSample) map[string]time.Duration {
	d := map[string]time.Duration{}
	for k, v := range to.groups {
		d[k] = v - from.groups[k]
	}
	for pid, v := range to.pg {
		d[b5CPUPostgres] += v - from.pg[pid]
	}
	named := time.Duration(0)
	for k, v := range d {
		if k != b5CPUMachine {
			named += v
		}
	}
	d[b5CPUOther] = max(0, d[b5CPUMachine]-named)
	return d
}

// b5CPUGroups is the order the report lists the groups in.
func b5CPUGroups(d map[string]time.Duration) []string {
	out := []string{}
	for _, k := range append(append([]string{b5CPUPostgres}, b5CPUProcs...), b5CPUBench, b5CPUOther) {
		if _, ok := d[k]; ok {
			out = append(out, k)
		}
	}
	return out
}

// b5CPUTable renders the split as CPU milliseconds per order and as a
// share of the machine's busy time.
func b5CPUTable(d map[string]time.Duration, orders int, wall time.Duration) string {
	var sb strings.Builder
	total := d[b5CPUMachine]
	fmt.Fprintf(&sb, "CPU during the capacity probe: %.2f of %d cores busy over %.1f s; per order:\n", total.Seconds()/wall.Seconds(), b5Cores(), wall.Seconds())
	fmt.Fprintf(&sb, "%-16s %10s %7s\n", "process", "ms/order", "share")
	for _, k := range b5CPUGroups(d) {
		fmt.Fprintf(&sb, "%-16s %10.2f %6.0f%%\n", k, b5Ms(d[k])/float64(orders), 100*d[k].Seconds()/max(total.Seconds(), 1e-9))
	}
	fmt.Fprintf(&sb, "%-16s %10.2f %6s\n", b5CPUMachine, b5Ms(total)/float64(orders), "100%")
	return sb.String()
}

func b5Cores() int {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	n := 0
	for line := range strings.Lines(string(data)) {
		if strings.HasPrefix(line, "cpu") && !strings.HasPrefix(line, "cpu ") {
			n++
		}
	}
	return n
}

// b5ProcCPU is a process's user + system time from /proc/<pid>/stat
// (fields 14 and 15, counted after the parenthesised command name, which
// may itself hold spaces).
func b5ProcCPU(pid int) (time.Duration, error) {
	if pid <= 0 {
		return 0, errors.New("no process")
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	var ticks int64
	for _, s := range f[11:13] { // utime, stime
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += v
	}
	return time.Duration(ticks * b5TickNanos), nil
}

// b5MachineCPU is the busy time of every CPU from /proc/stat's first line:
// everything but idle and iowait (guest time is already in user).
func b5MachineCPU() (time.Duration, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, errors.New("malformed /proc/stat")
	}
	var ticks int64
	for i, s := range f[1:9] { // user nice system idle iowait irq softirq steal
		if i == 3 || i == 4 {
			continue
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += v
	}
	return time.Duration(ticks * b5TickNanos), nil
}
