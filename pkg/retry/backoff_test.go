package retry

import (
	"testing"
	"time"
)

func TestDelayIsBoundedByCappedExponential(t *testing.T) {
	t.Parallel()
	p := Backoff{Base: 100 * time.Millisecond, Max: time.Second, Rand: func() float64 { return 0.999999 }}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		got := p.Delay(i + 1)
		if got > w*time.Millisecond || got < w*time.Millisecond*99/100 {
			t.Errorf("attempt %d: delay %v, want about %v", i+1, got, w*time.Millisecond)
		}
	}
	if d := p.Delay(500); d > time.Second {
		t.Errorf("huge attempt overflowed the cap: %v", d)
	}
}

func TestDelayUsesFullJitter(t *testing.T) {
	t.Parallel()
	p := Backoff{Base: time.Second, Max: time.Minute, Rand: func() float64 { return 0 }}
	if d := p.Delay(5); d != 0 {
		t.Fatalf("full jitter must reach zero, got %v", d)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	if err := (Backoff{Base: time.Minute, Max: time.Second}).Validate(); err == nil {
		t.Fatal("Max < Base accepted")
	}
	if err := (Backoff{}).Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestFloorKeepsAShareOfTheCeiling(t *testing.T) {
	t.Parallel()
	p := Backoff{Base: time.Second, Max: time.Minute, Floor: 0.5, Rand: func() float64 { return 0 }}
	if d := p.Delay(3); d < 2*time.Second {
		t.Fatalf("delay %v below half the 4s ceiling", d)
	}
	if err := (Backoff{Floor: 1}).Validate(); err == nil {
		t.Fatal("Floor 1 accepted")
	}
}
