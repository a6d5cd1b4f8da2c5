package outbox

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lossless-dev/lossless/pkg/retry"
)

// After many failed batches in a row the loop's backoff reaches minutes;
// when the failures are the database being down, the loop still polls it
// every OutageProbeInterval, so it resumes within a second of its return.
func TestOutageWaitIsCappedWhileOtherBatchFailuresBackOff(t *testing.T) {
	t.Parallel()
	cfg := Config{}
	cfg.setDefaults()
	r := &Relay{cfg: cfg, policy: retry.Backoff{Base: cfg.BackoffBase, Max: cfg.BackoffMax, Rand: func() float64 { return 0.999999 }}}
	down := &pgconn.ConnectError{Config: &pgconn.Config{Host: "127.0.0.1", Port: 1}}
	if got := r.failureWait(down, 20); got > cfg.OutageProbeInterval {
		t.Errorf("database down: wait %v after 20 failures, want at most %v", got, cfg.OutageProbeInterval)
	}
	if got := r.failureWait(errors.New(`relation "outbox" does not exist`), 20); got < time.Minute {
		t.Errorf("other failure: wait %v after 20 failures, want the growing backoff (up to %v)", got, cfg.BackoffMax)
	}
}
