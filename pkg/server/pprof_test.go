package server_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"testing"

	"github.com/lossless-dev/lossless/pkg/server"
)

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // test
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

// TestPprofIsOffByDefault: without Config.Pprof no profile is served.
func TestPprofIsOffByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{"/debug/pprof/profile?seconds=1", "/debug/pprof/heap"} {
		if code, _ := get(t, b.base+path); code != http.StatusNotFound {
			t.Errorf("GET %s with pprof off: HTTP %d, want 404", path, code)
		}
	}
}

// TestPprofServesProfilesWhenEnabled: with Config.Pprof a CPU profile and
// the heap profile are served as gzipped pprof protobufs, and the API still
// answers beside them.
func TestPprofServesProfilesWhenEnabled(t *testing.T) {
	t.Parallel()
	b := setupWith(t, server.Config{Pprof: true})
	for _, path := range []string{"/debug/pprof/profile?seconds=1", "/debug/pprof/heap"} {
		code, body := get(t, b.base+path)
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
	}
	if code, _ := get(t, b.base+"/debug/pprof/nosuchprofile"); code != http.StatusNotFound {
		t.Errorf("unknown profile: HTTP %d, want 404", code)
	}
	if code, _ := get(t, b.base+"/debug/pprof/profile?seconds=600"); code != http.StatusBadRequest {
		t.Errorf("profile longer than the write timeout: HTTP %d, want 400", code)
	}
	if code, _ := get(t, b.base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz beside pprof: HTTP %d", code)
	}
}
