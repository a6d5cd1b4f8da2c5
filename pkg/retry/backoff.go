package retry

import (
	"errors"
	"math/rand/v2"
	"time"
)

// Backoff computes retry delays: capped exponential growth with full jitter
// (AWS Architecture Blog, "Exponential Backoff And Jitter"). Full jitter
// spreads retries of many failed rows over the whole window, so a database
// or provider that comes back is not hit by a synchronised wave.
type Backoff struct {
	// Base is the upper bound of the first retry's delay. Default 1s.
	Base time.Duration
	// Max caps every delay. Default 5m.
	Max time.Duration
	// Floor is the share of the ceiling every delay keeps, in [0, 1): 0 is
	// full jitter (delays anywhere in [0, ceiling]), 0.5 "equal jitter"
	// (in [ceiling/2, ceiling]). A floor bounds how many retries fit in a
	// time window, which full jitter does not. Default 0.
	Floor float64
	// Rand returns a float in [0,1); nil uses math/rand/v2. Tests inject it.
	Rand func() float64
}

// Validate reports a backoff that cannot produce sane delays.
func (p Backoff) Validate() error {
	if p.Base < 0 || p.Max < 0 {
		return errors.New("retry: backoff Base and Max must not be negative")
	}
	if p.Base > 0 && p.Max > 0 && p.Max < p.Base {
		return errors.New("retry: backoff Max must be at least Base")
	}
	if p.Floor < 0 || p.Floor >= 1 {
		return errors.New("retry: backoff Floor must be within [0, 1)")
	}
	return nil
}

// Delay returns the delay before retry number attempt (1 = first retry):
// a uniform random value in [Floor·c, c], c = min(Max, Base·2^(attempt-1)).
func (p Backoff) Delay(attempt int) time.Duration {
	base, maxDelay := p.Base, p.Max
	if base <= 0 {
		base = time.Second
	}
	if maxDelay <= 0 {
		maxDelay = 5 * time.Minute
	}
	ceiling := maxDelay
	if attempt < 1 {
		attempt = 1
	}
	// Shift only while it cannot overflow or pass the cap.
	if shift := attempt - 1; shift < 62 && base<<shift > 0 && base<<shift < maxDelay {
		ceiling = base << shift
	}
	r := rand.Float64
	if p.Rand != nil {
		r = p.Rand
	}
	return time.Duration((p.Floor + (1-p.Floor)*r()) * float64(ceiling+1))
}
