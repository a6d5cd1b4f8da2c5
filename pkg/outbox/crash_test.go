package outbox_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

// Environment of TestCrashLoopChild, set by the parent test only.
const (
	envCrashDSN    = "OUTBOX_TEST_CRASH_CHILD_DSN"
	envCrashPoison = "OUTBOX_TEST_CRASH_CHILD_POISON"
	envCrashSlow   = "OUTBOX_TEST_CRASH_CHILD_SLOW" // "1": the type in slow mode, 1 s lease
)

const crashMaxAttempts = 3

// TestCrashLoopChild is the relay process of TestPoisonThatKillsTheProcessEndsFailed,
// run by it as a subprocess: it drains the outbox and exits 0, unless it
// dispatches the poison event, which kills the process (os.Exit, no deferred
// code, no rollback sent: the server sees the connection drop, as after a
// SIGKILL or an OOM kill).
func TestCrashLoopChild(t *testing.T) {
	dsn, poison := os.Getenv(envCrashDSN), os.Getenv(envCrashPoison)
	if dsn == "" {
		t.Skip("runs as the subprocess of TestPoisonThatKillsTheProcessEndsFailed")
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d := outbox.DispatcherFunc(func(_ context.Context, ev outbox.Event) (outbox.Commit, error) {
		if ev.ID.String() == poison {
			os.Exit(3)
		}
		return nil, nil
	})
	cfg := outbox.Config{MaxAttempts: crashMaxAttempts, PollInterval: 10 * time.Millisecond}
	var opts []outbox.Option
	if os.Getenv(envCrashSlow) == "1" {
		cfg.LeaseDuration = time.Second // the poison's lease must expire before the next run claims it
		opts = append(opts, outbox.WithSlowDispatch(testType))
	}
	r, err := outbox.NewRelay(pool, map[string]outbox.Dispatcher{testType: d}, cfg, discard(), nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	// The parent judges by the rows; the child only stops once nothing is
	// left to dispatch (events behind a FAILED one wait for an operator).
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		var pending int
		if err := pool.QueryRow(ctx, `
			SELECT count(*) FROM outbox o
			WHERE status = 'PENDING'
			  AND NOT EXISTS (SELECT 1 FROM outbox f WHERE f.aggregate_id = o.aggregate_id AND f.status = 'FAILED')`).Scan(&pending); err == nil && pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestPoisonThatKillsTheProcessEndsFailed(t *testing.T) {
	t.Parallel()
	crashes := crashLoop(t, false)
	if crashes > crashMaxAttempts+1 {
		t.Errorf("%d crashes, want at most %d (one uncharged, in a batch of several)", crashes, crashMaxAttempts+1)
	}
}

// In slow mode the committed lease is the record that survives the crash:
// an expired lease of an event dispatched alone charges it an attempt; the
// events in flight beside the poison at the first crash are not charged.
func TestSlowDispatch_PoisonThatKillsTheProcessEndsFailed(t *testing.T) {
	t.Parallel()
	if crashes := crashLoop(t, true); crashes > crashMaxAttempts+1 {
		t.Errorf("%d crashes, want at most %d (one uncharged, with others in flight)", crashes, crashMaxAttempts+1)
	}
}

// crashLoop runs the relay child until it exits without crashing on the
// poison, checks the rows and returns how many times it crashed.
func crashLoop(t *testing.T, slow bool) int {
	t.Helper()
	dsn := pgtest.NewDatabase(t, outbox.Migrations(""))
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var evs []outbox.Event
	for _, agg := range []string{"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9"} {
		evs = append(evs, event(agg, 1))
	}
	poison := evs[3]
	// A later event of the poison's aggregate: it waits behind it, as always.
	blocked := event("a3", 2)
	appendCommitted(t, pool, append(evs, blocked)...)

	// Each crash is charged from the next claim on; the first one, in a
	// batch of several events, only marks them suspect.
	const maxRuns = crashMaxAttempts + 4
	crashes := 0
	for run := 0; run < maxRuns; run++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashLoopChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), envCrashDSN+"="+dsn, envCrashPoison+"="+poison.ID.String())
		if slow {
			cmd.Env = append(cmd.Env, envCrashSlow+"=1")
		}
		out, err := cmd.CombinedOutput()
		cancel()
		var exit *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &exit) && exit.ExitCode() == 3:
			crashes++
			continue
		default:
			t.Fatalf("relay run %d: %v\n%s", run, err, out)
		}
		break
	}
	p := rowOf(t, pool, poison.ID)
	if p.Status != "FAILED" || p.Attempts != crashMaxAttempts || p.LastError == nil || !strings.Contains(*p.LastError, "died while dispatching") {
		t.Fatalf("poison after %d crashes: %+v (last_error %v); want FAILED with %d attempts charged and the reason",
			crashes, p, deref(p.LastError), crashMaxAttempts)
	}
	for _, ev := range evs {
		if ev.ID == poison.ID {
			continue
		}
		r := rowOf(t, pool, ev.ID)
		if r.Status != "PUBLISHED" {
			t.Errorf("event of %s: %+v, want PUBLISHED", ev.AggregateID, r)
		}
		if slow && r.Attempts != 1 {
			t.Errorf("event of %s in flight beside the poison: %+v, want published at its first charged attempt", ev.AggregateID, r)
		}
	}
	if r := rowOf(t, pool, blocked.ID); r.Status != "PENDING" || r.Attempts != 0 {
		t.Errorf("event behind the poison: %+v, want PENDING and never attempted", r)
	}
	return crashes
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
