package server_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/pkg/server"
)

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	return getWith(t, http.DefaultClient, url)
}

func getWith(t *testing.T, hc *http.Client, url string) (int, []byte) {
	t.Helper()
	resp, err := hc.Get(url) //nolint:noctx // test
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// TestPprofIsOffByDefault: without Config.PprofAddr no profile is served
// and no pprof listener is bound.
func TestPprofIsOffByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if a := b.srv.PprofAddr(); a != "" {
		t.Fatalf("PprofAddr() = %q with pprof off", a)
	}
	for _, path := range []string{"/debug/pprof/profile?seconds=1", "/debug/pprof/heap"} {
		if code, _ := get(t, b.base+path); code != http.StatusNotFound {
			t.Errorf("GET %s with pprof off: HTTP %d, want 404", path, code)
		}
	}
}

// TestPprofServesProfilesOnItsOwnLoopbackListener: with Config.PprofAddr a
// CPU profile and the heap profile are served as gzipped pprof protobufs on
// that listener, and never on the HTTP listener, which the API shares.
func TestPprofServesProfilesOnItsOwnLoopbackListener(t *testing.T) {
	t.Parallel()
	b := setupWith(t, server.Config{PprofAddr: "127.0.0.1:0"})
	pp := "http://" + b.srv.PprofAddr()
	for _, path := range []string{"/debug/pprof/profile?seconds=1", "/debug/pprof/heap"} {
		code, body := get(t, pp+path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: HTTP %d: %s", path, code, body)
		}
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("GET %s: not a gzipped profile: %v", path, err)
		}
		raw, err := io.ReadAll(zr)
		if err != nil || len(raw) == 0 {
			t.Fatalf("GET %s: profile body unreadable (%d bytes): %v", path, len(raw), err)
		}
		if code, _ := get(t, b.base+path); code != http.StatusNotFound {
			t.Errorf("GET %s on the HTTP listener: HTTP %d, want 404", path, code)
		}
	}
	if code, _ := get(t, pp+"/debug/pprof/nosuchprofile"); code != http.StatusNotFound {
		t.Errorf("unknown profile: HTTP %d, want 404", code)
	}
	if code, _ := get(t, pp+"/debug/pprof/profile?seconds=600"); code != http.StatusBadRequest {
		t.Errorf("profile longer than the write timeout: HTTP %d, want 400", code)
	}
	if code, _ := get(t, pp+"/readyz"); code != http.StatusNotFound {
		t.Errorf("/readyz on the pprof listener: HTTP %d, want 404", code)
	}
	if code, _ := get(t, b.base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz beside pprof: HTTP %d", code)
	}
}

// TestPprofRefusesANonLoopbackAddress: the profiles have no
// authentication, so a listener reachable from the network is a
// configuration error, not a start.
func TestPprofRefusesANonLoopbackAddress(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{":6060", "0.0.0.0:6060", "10.1.2.3:6060", "[::]:6060", "example.com:6060", "6060"} {
		cfg := server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PprofAddr: addr}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "pprof address") {
			t.Errorf("PprofAddr %q: Validate() = %v, want a pprof address error", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:6060", "[::1]:6060", "localhost:0"} {
		cfg := server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", PprofAddr: addr}
		if err := cfg.Validate(); err != nil {
			t.Errorf("PprofAddr %q: Validate() = %v, want nil", addr, err)
		}
	}
}
