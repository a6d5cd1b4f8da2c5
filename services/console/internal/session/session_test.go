package session_test

import (
	"sync"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/services/console/internal/session"
)

// clock is a settable time for the store.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newStore(t *testing.T, cfg session.Config) (*session.Store, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)}
	cfg.Now = c.now
	s, err := session.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func TestSession_IdleTimeoutAndLifetime(t *testing.T) {
	s, c := newStore(t, session.Config{TTL: time.Hour, Idle: 10 * time.Minute})
	a, err := s.Create("alice", "alice", [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.ID) < 43 {
		t.Fatalf("id %q: want 32 random bytes", a.ID)
	}
	// Used every 9 minutes: alive until the lifetime ends.
	for range 6 {
		c.add(9 * time.Minute)
		if got, ok := s.Get(a.ID); !ok || got.Principal != "alice" {
			t.Fatalf("at %s: session gone, want alive (used within the idle timeout)", c.now())
		}
	}
	c.add(7 * time.Minute) // 61 minutes after login
	if _, ok := s.Get(a.ID); ok {
		t.Fatal("session alive past its lifetime")
	}
	b, _ := s.Create("bob", "bob", [32]byte{2})
	c.add(10 * time.Minute)
	if _, ok := s.Get(b.ID); ok {
		t.Fatal("session alive after the idle timeout")
	}
	if s.Len() != 0 {
		t.Fatalf("%d sessions kept, want the expired ones dropped", s.Len())
	}
}

func TestSession_DeleteAndUnknown(t *testing.T) {
	s, _ := newStore(t, session.Config{})
	a, _ := s.Create("alice", "", [32]byte{1})
	for _, id := range []string{"", "x", a.ID + "x"} {
		if _, ok := s.Get(id); ok {
			t.Fatalf("Get(%q) found a session", id)
		}
	}
	s.Delete(a.ID)
	if _, ok := s.Get(a.ID); ok {
		t.Fatal("session alive after Delete")
	}
}

// At the bound a login drops the least recently used session, after the
// expired ones.
func TestSession_BoundedDropsLeastRecentlyUsed(t *testing.T) {
	s, c := newStore(t, session.Config{Max: 3, Idle: time.Hour})
	var ids []string
	for _, p := range []string{"a", "b", "c"} {
		n, _ := s.Create(p, p, [32]byte{})
		ids = append(ids, n.ID)
		c.add(time.Minute)
	}
	s.Get(ids[0]) // a is now the most recently used; b the least
	d, _ := s.Create("d", "d", [32]byte{})
	if s.Len() != 3 {
		t.Fatalf("%d sessions, want the bound 3", s.Len())
	}
	for i, want := range []bool{true, false, true} {
		if _, ok := s.Get(ids[i]); ok != want {
			t.Errorf("session %d alive %v, want %v", i, ok, want)
		}
	}
	if _, ok := s.Get(d.ID); !ok {
		t.Error("the new session is not there")
	}
}

func TestSession_ConcurrentUse(t *testing.T) {
	s, _ := newStore(t, session.Config{Max: 50})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				n, err := s.Create("p", "p", [32]byte{})
				if err != nil {
					t.Error(err)
					return
				}
				s.Get(n.ID)
				s.Delete(n.ID)
			}
		})
	}
	wg.Wait()
	if s.Len() > 50 {
		t.Fatalf("%d sessions, over the bound", s.Len())
	}
}
