package login_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/services/console/internal/login"
)

func TestTrustedProxies_ClientAddr(t *testing.T) {
	tp, err := login.ParseTrustedProxies(" 10.0.0.0/8, 192.0.2.1 ,2001:db8:ffff::/48")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, peer, xff, want string
	}{
		{"untrusted peer: its forwarded header is ignored", "198.51.100.7:5000", "203.0.113.9", "198.51.100.7"},
		{"behind the load balancer", "10.1.2.3:5000", "203.0.113.9", "203.0.113.9"},
		{"the client's own hops left of the real one are ignored", "10.1.2.3:5000", "1.1.1.1, 203.0.113.9", "203.0.113.9"},
		{"two trusted hops", "10.1.2.3:5000", "203.0.113.9, 192.0.2.1", "203.0.113.9"},
		{"header lines joined", "10.1.2.3:5000", "203.0.113.9\n10.9.9.9", "203.0.113.9"},
		{"no header: the proxy", "10.1.2.3:5000", "", "10.1.2.3"},
		{"garbage hop ends the walk", "10.1.2.3:5000", "203.0.113.9, not-an-ip", "10.1.2.3"},
		{"IPv6 proxy", "[2001:db8:ffff::1]:443", "2001:db8:1:2::7", "2001:db8:1:2::7"},
	} {
		r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/login", nil)
		r.RemoteAddr = c.peer
		if c.xff != "" {
			for _, line := range strings.Split(c.xff, "\n") {
				r.Header.Add("X-Forwarded-For", line)
			}
		}
		if got := tp.ClientAddr(r); got != c.want {
			t.Errorf("%s: ClientAddr = %q, want %q", c.name, got, c.want)
		}
	}
	var none login.TrustedProxies
	r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/login", nil)
	r.RemoteAddr = "10.1.2.3:5000"
	r.Header.Set("X-Forwarded-For", "203.0.113.9")
	if got := none.ClientAddr(r); got != "10.1.2.3" {
		t.Errorf("no trusted proxies: %q, want the peer", got)
	}
	if _, err := login.ParseTrustedProxies("10.0.0.0/8,lb.internal"); err == nil {
		t.Error("a host name was accepted as a trusted proxy")
	}
}

// A name and an address are limited apart: failures under one key leave
// the others free.
func TestLimiter_KeysAreCountedApart(t *testing.T) {
	l, err := login.NewLimiter(login.LimitConfig{Failures: 2})
	if err != nil {
		t.Fatal(err)
	}
	l.Fail("addr 192.0.2.1", "name alice")
	l.Fail("addr 192.0.2.2", "name alice")
	if ok, _ := l.Allow("addr 192.0.2.3", "name alice"); ok {
		t.Fatal("alice allowed after 2 failures from two addresses")
	}
	if ok, _ := l.Allow("addr 192.0.2.1", "name bob"); !ok {
		t.Fatal("bob refused from an address with one failure")
	}
}
