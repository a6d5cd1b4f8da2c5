package localstack

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/waitfor"
)

func TestProcess_PidNamesTheRunningChildAndIsZeroOnceItExited(t *testing.T) {
	p := &Process{Name: "sleeper", Path: "/bin/sleep", Args: []string{"60"},
		out: &prefixWriter{mu: &sync.Mutex{}, out: new(bytes.Buffer), prefix: "sleeper| "}}
	if got := p.Pid(); got != 0 {
		t.Fatalf("Pid before Start = %d, want 0", got)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(5 * time.Second) })
	pid := p.Pid()
	// Start returns once the child's execve has passed the point of no
	// return, a moment before the kernel has set up the new arguments: an
	// empty cmdline is read until then, so wait for it (bounded).
	var args []string
	if !waitfor.Until(5*time.Second, func() bool {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			t.Fatalf("Pid %d has no /proc entry: %v", pid, err)
		}
		args = strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		return len(args) == 2 && args[0] == "/bin/sleep" && args[1] == "60"
	}) {
		t.Fatalf("process %d runs %q, want /bin/sleep 60", pid, args)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if got := p.Pid(); got != 0 {
		t.Fatalf("Pid after the process exited = %d, want 0", got)
	}
}
