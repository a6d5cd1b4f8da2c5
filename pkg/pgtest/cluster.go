package pgtest

// StartCluster starts a throw-away PostgreSQL cluster from the local
// server binaries (initdb + pg_ctl): in a temporary folder, on a free loopback
// port, as an unprivileged OS user when the caller is root (initdb refuses to
// run as root). Tests, benchmarks and `make run` use it on machines without
// Docker; anything that has a server passes its DSN instead (Options.ServerDSN
// for tests).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoBinaries is returned when no PostgreSQL server binaries can be found.
var ErrNoBinaries = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found: " +
	"install them with `sudo apt-get install -y postgresql` (Debian/Ubuntu) or " +
	"`brew install postgresql` (macOS), or use a running server " +
	"(make run and the benchmarks read DATABASE_URL, " +
	"e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)")

// ClusterOptions configure StartCluster. The zero value is valid.
type ClusterOptions struct {
	// Dir holds the data and socket folders. Default: a new temporary folder,
	// removed by Remove.
	Dir string
	// Port to listen on, loopback only. Default 0: a free port.
	Port int
	// Fsync keeps PostgreSQL's durable commit (fsync=on). Default false: tests
	// and the local demo do not need crash durability of the host, and the
	// commit floor becomes CPU-bound instead of disk-bound. Benchmarks that
	// compare against pgbench anchors set it, so both sides pay the same flush.
	Fsync bool
	// MaxConnections is the server's max_connections. Default 300.
	MaxConnections int
	// StatStatements preloads pg_stat_statements (a contrib module Debian's
	// postgresql package ships), so that a benchmark can name the statements
	// the server spends its time on. Default false: not every PostgreSQL
	// install carries contrib, and the server would refuse to start.
	StatStatements bool
	// CommitTimestamps turns track_commit_timestamp on, so that
	// pg_xact_commit_timestamp(xmin) tells when a row's last writer
	// committed (benchmark B3 times each job's completion by it). Default
	// false: it costs every commit a little.
	CommitTimestamps bool
	// BinDir is where initdb and pg_ctl live. Default: $PATH, then the newest
	// /usr/lib/postgresql/*/bin.
	BinDir string
	// TLSCertFile and TLSKeyFile, when set, turn ssl on with this
	// certificate and key (PEM), copied into the data folder with the owner
	// and mode the server insists on. Clients may then connect with
	// sslmode=verify-full and sslrootcert=<the CA>; DSN keeps
	// sslmode=disable. Default "": no TLS.
	TLSCertFile, TLSKeyFile string
}

// Cluster is a running (or stopped) local PostgreSQL cluster.
type Cluster struct {
	opts    ClusterOptions
	dataDir string
	sockDir string
	ownsDir bool
	runAs   *user.User // nil: run as the current user
}

// StartCluster initialises a new cluster and starts it.
func StartCluster(ctx context.Context, opts ClusterOptions) (*Cluster, error) {
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 300
	}
	bin, err := findBinDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	opts.BinDir = bin
	c := &Cluster{opts: opts}
	if os.Geteuid() == 0 {
		c.runAs, err = unprivilegedUser()
		if err != nil {
			return nil, err
		}
	}
	if c.opts.Dir == "" {
		dir, err := os.MkdirTemp("", "lossless-pg-")
		if err != nil {
			return nil, fmt.Errorf("create cluster folder: %w", err)
		}
		c.opts.Dir, c.ownsDir = dir, true
	}
	c.dataDir = filepath.Join(c.opts.Dir, "data")
	c.sockDir = filepath.Join(c.opts.Dir, "run")
	// The unprivileged user must be able to traverse the folder.
	if err := os.Chmod(c.opts.Dir, 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{c.dataDir, c.sockDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
		if err := c.chown(d); err != nil {
			return nil, err
		}
	}
	out, err := c.run(ctx, "initdb", "-D", c.dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	if err != nil {
		c.Remove()
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	if opts.TLSCertFile != "" {
		for src, dst := range map[string]string{opts.TLSCertFile: "server.crt", opts.TLSKeyFile: "server.key"} {
			b, err := os.ReadFile(src)
			if err != nil {
				c.Remove()
				return nil, fmt.Errorf("cluster TLS: %w", err)
			}
			path := filepath.Join(c.dataDir, dst)
			if err := os.WriteFile(path, b, 0o600); err != nil {
				c.Remove()
				return nil, err
			}
			if err := c.chown(path); err != nil {
				c.Remove()
				return nil, err
			}
		}
	}
	// A free port can be taken between probing and binding; try a few times.
	for attempt := 0; ; attempt++ {
		if c.opts.Port == 0 || attempt > 0 {
			if c.opts.Port, err = FreePort(); err != nil {
				return nil, err
			}
		}
		if err = c.Restart(ctx); err == nil || opts.Port != 0 || attempt == 3 {
			break
		}
	}
	if err != nil {
		c.Remove()
		return nil, err
	}
	return c, nil
}

// Port is the loopback TCP port the cluster listens on.
func (c *Cluster) Port() int { return c.opts.Port }

// DSN is a connection string for database db as the superuser "postgres".
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.opts.Port, db)
}

// Restart starts the server of an initialised cluster (again), keeping its data.
func (c *Cluster) Restart(ctx context.Context) error {
	fsync := "off"
	if c.opts.Fsync {
		fsync = "on"
	}
	o := strings.Join([]string{
		"-c listen_addresses=127.0.0.1",
		"-p " + strconv.Itoa(c.opts.Port),
		"-k " + c.sockDir,
		"-c fsync=" + fsync,
		"-c max_connections=" + strconv.Itoa(c.opts.MaxConnections),
	}, " ")
	if c.opts.StatStatements {
		o += " -c shared_preload_libraries=pg_stat_statements"
	}
	if c.opts.CommitTimestamps {
		o += " -c track_commit_timestamp=on"
	}
	if c.opts.TLSCertFile != "" {
		// server.crt and server.key in the data folder, where StartCluster
		// copied them.
		o += " -c ssl=on"
	}
	logFile := filepath.Join(c.sockDir, "server.log")
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-l", logFile, "-o", o, "-w", "-t", "30", "start"); err != nil {
		log, _ := os.ReadFile(logFile)
		return fmt.Errorf("pg_ctl start: %w: %s\n%s", err, out, tail(string(log), 2000))
	}
	return nil
}

// Stop shuts the server down (fast mode: clients are disconnected), keeping its data.
func (c *Cluster) Stop(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-m", "fast", "-w", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop: %w: %s", err, out)
	}
	return nil
}

// Crash stops the server the way a power cut or an OOM kill of the
// postmaster would (pg_ctl -m immediate: no shutdown checkpoint, every client
// cut off); the next Restart runs crash recovery. For fault injection.
func (c *Cluster) Crash(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-m", "immediate", "-w", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop -m immediate: %w: %s", err, out)
	}
	return nil
}

// Remove stops the server if it runs and deletes a folder Start created.
func (c *Cluster) Remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := os.Stat(filepath.Join(c.dataDir, "postmaster.pid")); err == nil {
		_, _ = c.run(ctx, "pg_ctl", "-D", c.dataDir, "-m", "immediate", "-w", "stop")
	}
	if c.ownsDir {
		_ = os.RemoveAll(c.opts.Dir)
	}
}

func (c *Cluster) run(ctx context.Context, tool string, args ...string) ([]byte, error) {
	closeInheritedOnExec()
	cmd := exec.CommandContext(ctx, filepath.Join(c.opts.BinDir, tool), args...)
	if c.runAs != nil {
		uid, _ := strconv.Atoi(c.runAs.Uid)
		gid, _ := strconv.Atoi(c.runAs.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		cmd.Env = append(os.Environ(), "HOME="+c.opts.Dir, "USER="+c.runAs.Username)
	}
	// The server must outlive neither a Ctrl-C of the parent's process group
	// nor be killed with it half-way: give it its own process group and stop
	// it explicitly with pg_ctl.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.Dir = c.opts.Dir
	return cmd.CombinedOutput()
}

func (c *Cluster) chown(path string) error {
	if c.runAs == nil {
		return nil
	}
	uid, _ := strconv.Atoi(c.runAs.Uid)
	gid, _ := strconv.Atoi(c.runAs.Gid)
	return os.Chown(path, uid, gid)
}

// unprivilegedUser picks the OS user that runs the server when we are root:
// "postgres" (created by Debian's package), else "nobody".
func unprivilegedUser() (*user.User, error) {
	for _, name := range []string{"postgres", "nobody"} {
		if u, err := user.Lookup(name); err == nil {
			return u, nil
		}
	}
	return nil, errors.New("running as root and neither the 'postgres' nor the 'nobody' OS user exists: initdb refuses to run as root; create a user (useradd postgres) or run as a normal user")
}

func findBinDir(explicit string) (string, error) {
	if explicit != "" {
		if _, err := os.Stat(filepath.Join(explicit, "initdb")); err != nil {
			return "", fmt.Errorf("%w (looked in %s)", ErrNoBinaries, explicit)
		}
		return explicit, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) < versionOf(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", ErrNoBinaries
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// closeInheritedOnExec marks every descriptor above stderr close-on-exec, so
// the server, which outlives this process, holds none of ours. Go opens its
// own files close-on-exec, but not those a process inherits: the workers of
// `go test -fuzz` talk to their coordinator over two inherited pipes (fd 3
// and 4), and a server keeping them open left the coordinator waiting
// forever for a dead worker's end of file. Not Linux: nothing to do.
func closeInheritedOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
