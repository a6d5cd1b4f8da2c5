package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/catalog"
	"github.com/lossless-dev/lossless/internal/devtools/declared"
	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/internal/devtools/runenv"
)

// envChildPorts, set by the tests below, makes the test binary run
// runlocal's main logic on the ports it holds (JSON of localstack.Ports)
// instead of the tests, so a test can signal it as a process of its own.
const envChildPorts = "RUNLOCAL_TEST_CHILD_PORTS"

func TestMain(m *testing.M) {
	if v := os.Getenv(envChildPorts); v != "" {
		var ports localstack.Ports
		if err := json.Unmarshal([]byte(v), &ports); err != nil {
			fmt.Fprintln(os.Stderr, envChildPorts+":", err)
			os.Exit(2)
		}
		os.Exit(runMain(ports))
	}
	os.Exit(m.Run())
}

// TestCtrlCStopsEverythingAndExitsZero starts runlocal, waits for its
// banner, checks what the make targets read from the running stack (its env
// file, metrics, traces: runningstack_test.go), sends SIGINT (a terminal's
// Ctrl-C) and expects exit status 0, the final line "stopped; nothing left
// running", every port of the stack (services, emulator, PostgreSQL) closed
// and the env file removed.
func TestCtrlCStopsEverythingAndExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack")
	}
	child := startChild(t)
	child.await(t, 3*time.Minute, "lossless is running")
	t.Run("make targets on the running stack", func(t *testing.T) { checkRunningStack(t, child.envFile) })
	child.interruptAndExpectCleanExit(t)
	if _, err := os.Stat(child.envFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("env file after the stop: %v, want it removed", err)
	}
}

// TestCtrlCDuringStartUpExitsZero sends SIGINT while runlocal is still
// building and starting: the stop the user asked for is not a failure.
func TestCtrlCDuringStartUpExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("starts part of the stack")
	}
	child := startChild(t)
	child.await(t, time.Minute, "building binaries")
	child.interruptAndExpectCleanExit(t)
	if _, err := os.Stat(child.envFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("env file after a stop during start-up: %v, want none", err)
	}
}

type childRun struct {
	cmd      *exec.Cmd
	ports    localstack.Ports
	services catalog.Catalog
	envFile  string      // where it writes its env file (RUNLOCAL_ENV_FILE)
	lines    chan string // stdout, closed at EOF
	seen     []string
	exit     chan error
}

func startChild(t *testing.T) *childRun {
	t.Helper()
	ports, err := localstack.FreePorts()
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(ports)
	if err != nil {
		t.Fatal(err)
	}
	_, thisFile, _, _ := runtime.Caller(0)
	cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:noctx // the test signals it and bounds its exit itself
	// runlocal builds the services from the repository root, as make runs it.
	cmd.Dir = filepath.Join(filepath.Dir(thisFile), "..", "..")
	envFile := filepath.Join(t.TempDir(), "run", "env")
	cmd.Env = append(os.Environ(), envChildPorts+"="+string(js), "DATABASE_URL=", "PUBSUB_EMULATOR_HOST=", "REPLICAS=", runenv.PathVar+"="+envFile)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	svcs, err := declared.Load(cmd.Dir)
	if err != nil {
		t.Fatal(err)
	}
	c := &childRun{cmd: cmd, ports: ports, services: svcs, envFile: envFile, lines: make(chan string, 1024), exit: make(chan error, 1)}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			c.lines <- s.Text()
		}
		close(c.lines)
		c.exit <- cmd.Wait()
	}()
	// A no-op once it has exited (os.Process knows it was waited for).
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return c
}

// await reads stdout until a line contains want.
func (c *childRun) await(t *testing.T, timeout time.Duration, want string) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("runlocal ended before printing %q; stdout:\n%s", want, strings.Join(c.seen, "\n"))
			}
			c.seen = append(c.seen, line)
			if strings.Contains(line, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no %q within %v; stdout:\n%s", want, timeout, strings.Join(c.seen, "\n"))
		}
	}
}

func (c *childRun) interruptAndExpectCleanExit(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(90 * time.Second)
	for open := true; open; {
		select {
		case line, ok := <-c.lines:
			if open = ok; ok {
				c.seen = append(c.seen, line)
			}
		case <-deadline:
			t.Fatalf("runlocal did not exit within 90s of SIGINT; stdout:\n%s", strings.Join(c.seen, "\n"))
		}
	}
	err := <-c.exit // sent right after stdout's EOF
	if err != nil {
		t.Fatalf("exit after SIGINT: %v, want status 0; stdout:\n%s", err, strings.Join(c.seen, "\n"))
	}
	last := ""
	for _, l := range c.seen {
		if strings.TrimSpace(l) != "" {
			last = l
		}
	}
	if last != "stopped; nothing left running" {
		t.Fatalf("last line %q, want %q; stdout:\n%s", last, "stopped; nothing left running", strings.Join(c.seen, "\n"))
	}
	for _, port := range c.listenedPorts() {
		var d net.Dialer
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := d.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
		cancel()
		if err == nil {
			_ = conn.Close()
			t.Errorf("port %d still accepts connections after the stop", port)
		} else if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("port %d: %v, want connection refused", port, err)
		}
	}
}

// listenedPorts are the stack's ports and, once the log named it, the
// ephemeral PostgreSQL's.
func (c *childRun) listenedPorts() []int {
	out := c.ports.AllPorts(c.services, 1)
	for _, l := range c.seen {
		var port int
		if i := strings.Index(l, "listening on 127.0.0.1:"); i >= 0 && strings.HasPrefix(l, "postgres") {
			if _, err := fmt.Sscanf(l[i:], "listening on 127.0.0.1:%d", &port); err == nil {
				out = append(out, port)
			}
		}
	}
	return out
}
