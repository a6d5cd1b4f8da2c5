// Package session keeps the console's login sessions: an opaque random id
// in the browser's cookie, everything else here, in memory. A session ends
// at its absolute lifetime, after an idle period, at logout, or when the
// credential it was created with is no longer the operator's (a caller
// checks that on every request with Session.Credential).
//
// In memory means one console replica: a second replica does not know the
// first one's sessions, and a restart logs everybody out (ADR 0019).
package session

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"sync"
	"time"
)

// Config of a Store; zero fields take the defaults.
type Config struct {
	// TTL is a session's absolute lifetime from login. Default 8h: a
	// working day, then log in again.
	TTL time.Duration
	// Idle ends a session unused for that long. Default 30m.
	Idle time.Duration
	// Max bounds the sessions kept; at the bound a login drops the least
	// recently used one. Default 10000.
	Max int
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Defaults of Config.
const (
	DefaultTTL  = 8 * time.Hour
	DefaultIdle = 30 * time.Minute
	DefaultMax  = 10000
)

func (c *Config) setDefaults() {
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Idle == 0 {
		c.Idle = DefaultIdle
	}
	if c.Max == 0 {
		c.Max = DefaultMax
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.TTL < 0 || c.Idle < 0 || c.Max < 0 {
		return errors.New("session: TTL, Idle and Max must not be negative")
	}
	return nil
}

// Session is one login.
type Session struct {
	// ID is the cookie's value: 32 random bytes, base64url. Never logged.
	ID string
	// Principal is who logged in: the audit rows' actor.
	Principal string
	// Operator names the credential's owner in the operators table (""
	// for the shared operator token).
	Operator string
	// Credential is the SHA-256 of the credential the session was created
	// with: when the operator's credential is no longer this one, the
	// session is void.
	Credential [32]byte
	Created    time.Time
	LastSeen   time.Time
}

// Store holds the sessions. Safe for concurrent use. It starts no
// goroutine: expired sessions are dropped when met and by every Create.
type Store struct {
	cfg Config
	mu  sync.Mutex
	// Keyed by the SHA-256 of the id: the map holds no usable cookie value.
	byKey map[[32]byte]*Session
}

// New returns an empty store.
func New(cfg Config) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, byKey: map[[32]byte]*Session{}}, nil
}

// Create starts a session for principal.
func (s *Store) Create(principal, operator string, credential [32]byte) (Session, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return Session{}, err
	}
	now := s.cfg.Now()
	n := &Session{ID: base64.RawURLEncoding.EncodeToString(b), Principal: principal, Operator: operator,
		Credential: credential, Created: now, LastSeen: now}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweep(now)
	if len(s.byKey) >= s.cfg.Max {
		var oldest [32]byte
		first := true
		for k, v := range s.byKey {
			if first || v.LastSeen.Before(s.byKey[oldest].LastSeen) {
				oldest, first = k, false
			}
		}
		delete(s.byKey, oldest)
	}
	s.byKey[sha256.Sum256([]byte(n.ID))] = n
	return *n, nil
}

// Get returns the live session of id and marks it used.
func (s *Store) Get(id string) (Session, bool) {
	if id == "" {
		return Session{}, false
	}
	k := sha256.Sum256([]byte(id))
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.byKey[k]
	if !ok {
		return Session{}, false
	}
	if s.expired(v, now) {
		delete(s.byKey, k)
		return Session{}, false
	}
	v.LastSeen = now
	return *v, true
}

// Delete ends the session of id (logout, or a credential found changed).
func (s *Store) Delete(id string) {
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byKey, k)
}

// Len is the number of sessions held, expired ones not yet dropped
// included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey)
}

func (s *Store) expired(v *Session, now time.Time) bool {
	return now.Sub(v.Created) >= s.cfg.TTL || now.Sub(v.LastSeen) >= s.cfg.Idle
}

// sweep drops the expired sessions; s.mu is held. Linear, on logins only:
// at most Max sessions.
func (s *Store) sweep(now time.Time) {
	for k, v := range s.byKey {
		if s.expired(v, now) {
			delete(s.byKey, k)
		}
	}
}
