package server

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// pprofPrefix is where Config.PprofAddr serves the runtime's profiles.
const pprofPrefix = "/debug/pprof/"

// maxProfileSeconds bounds one CPU profile request.
const maxProfileSeconds = 60

// newPprofServer serves PprofHandler on Config.PprofAddr's listener, which
// Validate keeps on loopback: the endpoints have no authentication, so only
// whoever is on the host (or has a port-forward) reaches them.
func newPprofServer(writeTimeout time.Duration) *http.Server {
	return &http.Server{Handler: PprofHandler(writeTimeout), ReadHeaderTimeout: DefaultReadHeaderTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: DefaultIdleTimeout}
}

// PprofHandler serves the runtime's profiles under /debug/pprof/ and 404
// elsewhere, for a listener of its own on a loopback address (see
// ValidateLoopback): it has no authentication. writeTimeout, the server's,
// bounds a CPU profile, and a longer one is refused. It is written against
// runtime/pprof rather than by importing net/http/pprof, whose init
// registers handlers on http.DefaultServeMux for the whole process.
//
//	GET /debug/pprof/profile?seconds=N   CPU profile of N seconds (default 30)
//	GET /debug/pprof/<name>              a named profile: heap, allocs, goroutine, block, mutex, threadcreate
func PprofHandler(writeTimeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, ok := strings.CutPrefix(r.URL.Path, pprofPrefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if name == "profile" {
			serveCPUProfile(w, r, writeTimeout)
			return
		}
		p := pprof.Lookup(name)
		if p == nil {
			http.Error(w, fmt.Sprintf("unknown profile %q", name), http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
		_ = p.WriteTo(w, 0)
	})
}

// ValidateLoopback accepts host:port addresses whose host is a loopback IP
// or "localhost": where an unauthenticated listener (profiles) may bind.
func ValidateLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: want host:port: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q: want a loopback address (127.0.0.1:port, [::1]:port or localhost:port): the profiles have no authentication", addr)
}

func serveCPUProfile(w http.ResponseWriter, r *http.Request, writeTimeout time.Duration) {
	sec := 30
	if v := r.URL.Query().Get("seconds"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxProfileSeconds {
			http.Error(w, fmt.Sprintf("seconds %q: want 1..%d", v, maxProfileSeconds), http.StatusBadRequest)
			return
		}
		sec = n
	}
	d := time.Duration(sec) * time.Second
	if writeTimeout > 0 && d >= writeTimeout {
		http.Error(w, fmt.Sprintf("a %v profile exceeds the server's write timeout %v", d, writeTimeout), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="profile"`)
	if err := pprof.StartCPUProfile(w); err != nil {
		// Another CPU profile is running: one at a time per process.
		w.Header().Del("Content-Disposition")
		http.Error(w, "could not start a CPU profile: "+err.Error(), http.StatusConflict)
		return
	}
	defer pprof.StopCPUProfile()
	select {
	case <-time.After(d):
	case <-r.Context().Done():
	}
}
