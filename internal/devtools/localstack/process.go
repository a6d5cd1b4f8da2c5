package localstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Process is one child process of the stack, restartable (the end-to-end test
// kills services with SIGKILL and starts them again).
type Process struct {
	Name string
	Path string
	Args []string
	Env  []string
	// Supervise restarts the process when it exits on its own (a crash, or
	// the provider's publish_then_crash fault), like a container restart
	// policy. Stop disables it first.
	Supervise bool
	out       *prefixWriter
	stopping  atomic.Bool
	restarts  atomic.Int32

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start launches the process. Its stdout and stderr lines are prefixed with its name.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s: already running", p.Name)
		}
	}
	cmd := exec.Command(p.Path, p.Args...) //nolint:noctx // lifetime is managed by Stop/Kill, not a context
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout = p.out
	cmd.Stderr = p.out
	// Own process group: a terminal Ctrl-C reaches only the supervisor, which
	// then stops children in order instead of all at once. Pdeathsig: if the
	// supervisor itself dies (kill -9, a test binary's timeout), the children
	// die with it instead of holding the ports of the next run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: start: %w", p.Name, err)
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	done := p.done
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
		if p.Supervise && !p.stopping.Load() {
			fmt.Fprintf(p.out, "exited (%v); restarting in %v\n", err, restartDelay)
			time.Sleep(restartDelay)
			if !p.stopping.Load() {
				p.restarts.Add(1)
				if err := p.Start(); err != nil {
					fmt.Fprintf(p.out, "restart failed: %v\n", err)
				}
			}
		}
	}()
	return nil
}

// Pid is the operating-system id of the running process (for sampling its
// /proc entry), or 0 when it has not started or has exited. A supervised
// restart runs under a new id: read it again rather than keeping it.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	select {
	case <-p.done:
		return 0
	default:
		return p.cmd.Process.Pid
	}
}

// restartDelay spaces restarts of a crashing supervised process.
const restartDelay = 500 * time.Millisecond

// Restarts counts supervised restarts so far.
func (p *Process) Restarts() int { return int(p.restarts.Load()) }

// Run starts the process and waits for it to exit successfully (one-shot jobs).
func (p *Process) Run(ctx context.Context) error {
	if err := p.Start(); err != nil {
		return err
	}
	select {
	case <-p.wait():
		return p.exitErr()
	case <-ctx.Done():
		_ = p.Kill()
		return ctx.Err()
	}
}

// Stop sends SIGTERM and waits up to timeout for a clean exit, then SIGKILLs.
// It returns the exit error (nil for exit code 0).
func (p *Process) Stop(timeout time.Duration) error {
	p.stopping.Store(true)
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return p.exitErr()
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return p.exitErr()
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s: did not exit within %v of SIGTERM; killed", p.Name, timeout)
	}
}

// Kill sends SIGKILL (a crash, for fault injection) and waits for the exit.
// A supervised process is then restarted by its supervisor.
func (p *Process) Kill() error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return errors.New(p.Name + ": not started")
	}
	_ = cmd.Process.Kill()
	<-done
	return nil
}

// Exited reports whether the process has exited, and its error.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.wait():
		return true, p.exitErr()
	default:
		return false, nil
	}
}

func (p *Process) wait() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

func (p *Process) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return fmt.Errorf("%s: %w", p.Name, p.err)
	}
	return nil
}

// prefixWriter prefixes every line with a fixed, padded name.
type prefixWriter struct {
	mu     *sync.Mutex
	out    io.Writer
	prefix string
	buf    []byte
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := indexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		if _, err := fmt.Fprintf(w.out, "%s%s\n", w.prefix, w.buf[:i]); err != nil {
			return 0, err
		}
		w.buf = w.buf[i+1:]
	}
	return len(b), nil
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}
