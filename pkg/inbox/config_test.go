package inbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A Deferred entry that never becomes applicable (F8: an unknown order) is
// parked after MaxAttempts AND MaxAge. With the default backoff that costs a
// handful of attempts whatever the jitter draws, not the dozens a low cap
// gives (30 s with full jitter: about 60 over 15 minutes).
func TestDefaultDeferredScheduleCostsAHandfulOfAttempts(t *testing.T) {
	t.Parallel()
	for _, draw := range []float64{0, 0.5, 0.999999} {
		var c Config
		c.setDefaults()
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

// After many failed batches in a row the technical backoff reaches a minute;
// when the failures are the database being down, the relay still polls it
// every OutageProbeInterval, so it resumes within a second of its return.
func TestOutageWaitIsCappedWhileOtherFailuresBackOff(t *testing.T) {
	t.Parallel()
	var c Config
	c.setDefaults()
	c.TechnicalBackoff.Rand = func() float64 { return 0.999999 }
	down := &pgconn.ConnectError{Config: &pgconn.Config{Host: "127.0.0.1", Port: 1}}
	if got := failureWait(c, down, 20); got > c.OutageProbeInterval {
		t.Errorf("database down: wait %v after 20 failures, want at most %v", got, c.OutageProbeInterval)
	}
	if got := failureWait(c, errors.New("relation \"inbox\" does not exist"), 20); got < 30*time.Second {
		t.Errorf("other failure: wait %v after 20 failures, want the technical backoff (about %v)", got, c.TechnicalBackoff.Max)
	}
}

// A zero field means its default, for Validate as for NewRelay: a service
// validating its configuration at start-up accepts the zero Config, and
// names the field it refuses.
func TestValidate_ZeroIsDefaultErrorsNameTheField(t *testing.T) {
	t.Parallel()
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	if err := (MonitorConfig{}).Validate(); err != nil {
		t.Fatalf("zero MonitorConfig: %v", err)
	}
	for field, c := range map[string]Config{
		"BatchSize":    {BatchSize: 10001},
		"PollInterval": {PollInterval: -time.Second},
		"MaxAttempts":  {MaxAttempts: -1},
	} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%+v: %v, want an error naming %s", c, err, field)
		}
	}
}
