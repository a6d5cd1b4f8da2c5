package login

import (
	"errors"
	"sync"
	"time"
)

// LimitConfig bounds failed logins per key (the web handler counts each
// attempt under the operator name and under the client address); zero
// fields take the defaults.
type LimitConfig struct {
	// Failures allowed under one key within Window; the next attempt
	// with that key is refused until the window ends. Default 10.
	Failures int
	// Window starts at a key's first failure. Default 15m.
	Window time.Duration
	// Addresses bounds the keys tracked; at the bound the oldest window
	// is dropped. Default 10000.
	Addresses int
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Defaults of LimitConfig.
const (
	DefaultFailures  = 10
	DefaultWindow    = 15 * time.Minute
	DefaultAddresses = 10000
)

// Limiter counts failed logins per key in fixed windows. A guess of a
// 32-character token is hopeless anyway; the limit keeps a credential
// spray slow and the log readable. Safe for concurrent use; no goroutine.
type Limiter struct {
	cfg LimitConfig
	mu  sync.Mutex
	by  map[string]*window
}

type window struct {
	start    time.Time
	failures int
}

// NewLimiter returns a limiter.
func NewLimiter(cfg LimitConfig) (*Limiter, error) {
	if cfg.Failures == 0 {
		cfg.Failures = DefaultFailures
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Addresses == 0 {
		cfg.Addresses = DefaultAddresses
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Failures < 0 || cfg.Window < 0 || cfg.Addresses < 0 {
		return nil, errors.New("login: LimitConfig fields must not be negative")
	}
	return &Limiter{cfg: cfg, by: map[string]*window{}}, nil
}

// Allow reports whether an attempt under every one of keys (an address, a
// name) may be made now, and if not, how long until it may.
func (l *Limiter) Allow(keys ...string) (bool, time.Duration) {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var wait time.Duration
	for _, key := range keys {
		w, ok := l.by[key]
		if !ok {
			continue
		}
		end := w.start.Add(l.cfg.Window)
		if !now.Before(end) {
			delete(l.by, key)
			continue
		}
		if w.failures >= l.cfg.Failures {
			wait = max(wait, end.Sub(now))
		}
	}
	return wait == 0, wait
}

// Fail counts a failed login under each of keys.
func (l *Limiter) Fail(keys ...string) {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, key := range keys {
		l.fail(key, now)
	}
}

func (l *Limiter) fail(addr string, now time.Time) {
	if w, ok := l.by[addr]; ok && now.Before(w.start.Add(l.cfg.Window)) {
		w.failures++
		return
	}
	if len(l.by) >= l.cfg.Addresses {
		var oldest string
		for a, w := range l.by {
			if !now.Before(w.start.Add(l.cfg.Window)) {
				delete(l.by, a)
			} else if oldest == "" || w.start.Before(l.by[oldest].start) {
				oldest = a
			}
		}
		if len(l.by) >= l.cfg.Addresses {
			delete(l.by, oldest)
		}
	}
	l.by[addr] = &window{start: now, failures: 1}
}
