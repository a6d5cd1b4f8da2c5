package login_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/services/console/internal/login"
)

const (
	aliceCred = "alice-0123456789abcdef0123456789abcdef"
	bobCred   = "bob-0123456789abcdef0123456789abcdef00"
)

func line(name, cred string) string {
	d := sha256.Sum256([]byte(cred))
	return name + " " + hex.EncodeToString(d[:]) + "\n"
}

func TestParseOperators(t *testing.T) {
	ops, err := login.ParseOperators(strings.NewReader("# operators\n\n" + line("alice", aliceCred) + line("bob@example.com", bobCred)))
	if err != nil || ops.Len() != 2 {
		t.Fatalf("%d operators, %v", ops.Len(), err)
	}
	if _, ok := ops.Check("alice", aliceCred); !ok {
		t.Error("alice's credential refused")
	}
	for _, c := range [][2]string{{"alice", bobCred}, {"bob@example.com", aliceCred}, {"carol", aliceCred}, {"alice", ""}, {"", ""}} {
		if _, ok := ops.Check(c[0], c[1]); ok {
			t.Errorf("Check(%q, %q) passed", c[0], c[1])
		}
	}
	// A short credential never matches, even when its digest is listed.
	short, _ := login.ParseOperators(strings.NewReader(line("eve", "short")))
	if _, ok := short.Check("eve", "short"); ok {
		t.Error("a credential shorter than operator.MinTokenLength passed")
	}
	for in, want := range map[string]string{
		"alice\n":                               "line 1",
		"al ice 00\n":                           "line 1",
		"alice nothex\n":                        "64 hex",
		"# x\n" + line("a b", "c"):              "line 2",
		line("alice", "x") + line("alice", "y"): "twice",
		"-alice " + strings.Repeat("0", 64):     "name",
	} {
		if _, err := login.ParseOperators(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one saying %q", in, err, want)
		}
	}
}

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

// The file is re-read when it changes; a broken file fails closed.
func TestFile_ReloadsAndFailsClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "operators")
	write := func(s string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	write(line("alice", aliceCred), t0)
	c := &clock{t: t0}
	f, err := login.OpenFile(path, 5*time.Second, c.now)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := f.Operators()
	if _, ok := ops.Check("alice", aliceCred); err != nil || !ok {
		t.Fatalf("alice refused: %v", err)
	}
	write(line("bob", bobCred), t0.Add(time.Second))
	// Not looked at again within 5 s.
	if ops, _ := f.Operators(); ops.Len() != 1 {
		t.Fatal("want the table unchanged within the check period")
	}
	c.add(5 * time.Second)
	ops, err = f.Operators()
	if _, ok := ops.Check("alice", aliceCred); err != nil || ok {
		t.Fatalf("alice still accepted after her removal (%v)", err)
	}
	if _, ok := ops.Current("bob"); !ok {
		t.Fatal("bob not loaded")
	}
	write("garbage\n", t0.Add(2*time.Second))
	c.add(5 * time.Second)
	if ops, err := f.Operators(); err == nil || ops.Len() != 0 {
		t.Fatalf("broken file: %d operators, error %v; want none and an error", ops.Len(), err)
	}
	if _, err := login.OpenFile(filepath.Join(t.TempDir(), "missing"), time.Second, nil); err == nil {
		t.Fatal("a missing file opened")
	}
}

func TestLimiter_PerAddressWindow(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l, err := login.NewLimiter(login.LimitConfig{Failures: 3, Window: time.Minute, Addresses: 2, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if ok, _ := l.Allow("192.0.2.1"); !ok {
			t.Fatal("refused before 3 failures")
		}
		l.Fail("192.0.2.1")
	}
	c.add(20 * time.Second)
	ok, wait := l.Allow("192.0.2.1")
	if ok || wait != 40*time.Second {
		t.Fatalf("after 3 failures: allowed %v, wait %s; want refused for the window's 40 s left", ok, wait)
	}
	if ok, _ := l.Allow("192.0.2.2"); !ok {
		t.Fatal("another address refused")
	}
	c.add(40 * time.Second)
	if ok, _ := l.Allow("192.0.2.1"); !ok {
		t.Fatal("still refused after the window")
	}
	// Bounded: a third address drops the oldest window.
	l.Fail("192.0.2.1")
	c.add(time.Second)
	l.Fail("192.0.2.2")
	l.Fail("192.0.2.2")
	l.Fail("192.0.2.2")
	l.Fail("192.0.2.3")
	if ok, _ := l.Allow("192.0.2.2"); ok {
		t.Fatal("192.0.2.2 allowed: its window was dropped instead of the oldest")
	}
}
