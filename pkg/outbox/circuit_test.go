package outbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/outbox"
)

type transitions []string

func (tr *transitions) record(name string, from, to outbox.CircuitState) {
	*tr = append(*tr, fmt.Sprintf("%s:%s->%s", name, from, to))
}

func newTestCircuit(tr *transitions) *outbox.Circuit {
	return outbox.NewCircuit("dep", outbox.CircuitConfig{Threshold: 3, ProbeInterval: time.Second, ProbeIntervalMax: 4 * time.Second}, tr.record)
}

func TestCircuit_OpensAfterThresholdFailuresInARow(t *testing.T) {
	t.Parallel()
	var tr transitions
	c := newTestCircuit(&tr)
	t0 := time.Unix(1000, 0)
	c.Failure(t0)
	c.Failure(t0)
	c.Success() // an answer in between: not in a row
	c.Failure(t0)
	c.Failure(t0)
	if c.State() != outbox.CircuitClosed || !c.Allow(t0) {
		t.Fatalf("after 2 failures in a row: %v, want closed and dispatching", c.State())
	}
	c.Failure(t0)
	if c.State() != outbox.CircuitOpen || c.Allow(t0) || c.Claimable(t0.Add(999*time.Millisecond)) {
		t.Fatalf("after 3 failures in a row: %v, want open, not dispatching, not claimable before the probe", c.State())
	}
	c.Failure(t0.Add(500 * time.Millisecond)) // a dispatch in flight when it opened
	if !c.Claimable(t0.Add(time.Second)) {
		t.Fatal("a late failure while open moved the probe")
	}
	if want := "dep:closed->open"; len(tr) != 1 || tr[0] != want {
		t.Fatalf("transitions %v, want [%s]", tr, want)
	}
}

func TestCircuit_OneProbeAtATime_GapDoublesToTheCap(t *testing.T) {
	t.Parallel()
	var tr transitions
	c := newTestCircuit(&tr)
	now := time.Unix(1000, 0)
	for range 3 {
		c.Failure(now)
	}
	var gaps []time.Duration
	for range 4 {
		// Find the probe time to the millisecond.
		opened := now
		for !c.Claimable(now) {
			now = now.Add(time.Millisecond)
		}
		gaps = append(gaps, now.Sub(opened))
		if !c.Allow(now) {
			t.Fatal("probe due but not granted")
		}
		if c.Allow(now) || c.Claimable(now) || c.State() != outbox.CircuitHalfOpen {
			t.Fatalf("second dispatch granted while the probe is in flight (%v)", c.State())
		}
		c.Failure(now)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}
	if fmt.Sprint(gaps) != fmt.Sprint(want) {
		t.Fatalf("probe gaps %v, want %v", gaps, want)
	}
}

func TestCircuit_ProbeSuccessClosesAndResetsTheGap(t *testing.T) {
	t.Parallel()
	var tr transitions
	c := newTestCircuit(&tr)
	now := time.Unix(1000, 0)
	for range 3 {
		c.Failure(now)
	}
	now = now.Add(time.Second)
	c.Allow(now)
	c.Failure(now) // gap 2 s
	now = now.Add(2 * time.Second)
	if !c.Allow(now) {
		t.Fatal("probe not granted")
	}
	c.Success()
	if c.State() != outbox.CircuitClosed || !c.Allow(now) {
		t.Fatalf("after a successful probe: %v", c.State())
	}
	for range 3 {
		c.Failure(now)
	}
	if c.Claimable(now.Add(999*time.Millisecond)) || !c.Claimable(now.Add(time.Second)) {
		t.Fatal("after closing, the next opening's first probe is not ProbeInterval away")
	}
	want := "[dep:closed->open dep:open->half_open dep:half_open->open dep:open->half_open dep:half_open->closed dep:closed->open]"
	if fmt.Sprint(tr) != want {
		t.Fatalf("transitions %v, want %s", tr, want)
	}
}

// A success of a dispatch that was in flight when the circuit opened closes
// it: the dependency answered.
func TestCircuit_AnySuccessCloses(t *testing.T) {
	t.Parallel()
	var tr transitions
	c := newTestCircuit(&tr)
	now := time.Unix(1000, 0)
	for range 3 {
		c.Failure(now)
	}
	c.Success()
	if c.State() != outbox.CircuitClosed || !c.Allow(now) {
		t.Fatalf("%v, want closed", c.State())
	}
}

func TestCircuit_AbandonedProbeMayBeRetriedAtOnce(t *testing.T) {
	t.Parallel()
	var tr transitions
	c := newTestCircuit(&tr)
	now := time.Unix(1000, 0)
	for range 3 {
		c.Failure(now)
	}
	now = now.Add(time.Second)
	c.Allow(now)
	c.Abandon()
	if c.State() != outbox.CircuitOpen || !c.Allow(now) {
		t.Fatalf("after an abandoned probe: %v, want a new probe at once", c.State())
	}
	c.Abandon()
	c.Abandon() // not half-open: no effect
	if c.State() != outbox.CircuitOpen {
		t.Fatalf("%v", c.State())
	}
}
