package inbox

import (
	"testing"
	"time"
)

// A Deferred entry that never becomes applicable (F8: an unknown order) is
// parked after MaxAttempts AND MaxAge. With the default backoff that costs a
// handful of attempts whatever the jitter draws, not the dozens a low cap
// gives (30 s with full jitter: about 60 over 15 minutes).
func TestDefaultDeferredScheduleCostsAHandfulOfAttempts(t *testing.T) {
	t.Parallel()
	for _, draw := range []float64{0, 0.5, 0.999999} {
		c := Config{}.withDefaults()
		c.DeferBackoff.Rand = func() float64 { return draw }
		var age time.Duration
		attempts := 0
		for {
			attempts++
			if attempts >= c.MaxAttempts && age >= c.MaxAge {
				break
			}
			age += c.DeferBackoff.Delay(attempts)
		}
		if attempts < c.MaxAttempts || attempts > 15 {
			t.Errorf("jitter draw %v: parked after %d attempts (%v), want %d..15", draw, attempts, age, c.MaxAttempts)
		}
		t.Logf("jitter draw %v: parked at attempt %d, %v after receipt", draw, attempts, age.Round(time.Second))
	}
}
