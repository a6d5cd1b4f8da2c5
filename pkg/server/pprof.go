package server

import (
	"fmt"
	"net/http"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// pprofPrefix is where Config.Pprof serves the runtime's profiles.
const pprofPrefix = "/debug/pprof/"

// maxProfileSeconds bounds one CPU profile request.
const maxProfileSeconds = 60

// withPprof serves the runtime's profiles under pprofPrefix and everything
// else with next. The profiles bypass next's request deadline (a CPU profile
// lasts its seconds parameter); the server's WriteTimeout still bounds them,
// and a longer profile is refused. It is written against runtime/pprof
// rather than by importing net/http/pprof, whose init registers handlers on
// http.DefaultServeMux for the whole process.
//
//	GET /debug/pprof/profile?seconds=N   CPU profile of N seconds (default 30)
//	GET /debug/pprof/<name>              a named profile: heap, allocs, goroutine, block, mutex, threadcreate
func withPprof(next http.Handler, writeTimeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, ok := strings.CutPrefix(r.URL.Path, pprofPrefix)
		if !ok {
			next.ServeHTTP(w, r)
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
