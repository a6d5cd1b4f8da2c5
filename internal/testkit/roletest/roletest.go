// Package roletest is the test every service with roles runs
// (docs/adr/0013-api-and-worker-roles.md): on one database, an api replica
// serves the API and runs no loop, so the work it takes waits; a worker
// replica serves no API (no gRPC listener, REST 404, /healthz still 200)
// and its loops do the waiting work. Run checks what every service shares;
// the service's hooks send its work and assert its business effect (rows,
// statuses, messages). OperatorServiceIsMounted is the check every service
// that mounts the one operator API (pkg/operator) shares.
package roletest

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// App is an assembled service (its app.App).
type App interface {
	Run(ctx context.Context) error
	// HTTPAddr is the bound HTTP listener's address.
	HTTPAddr() string
	// GRPCAddr is the bound gRPC listener's address, "" when none is.
	GRPCAddr() string
}

// Request is one HTTP request; Path is appended to a replica's base URL.
type Request struct {
	Method, Path, Body string
}

// Replicas is a service's role test.
type Replicas[A App] struct {
	// New assembles the service in role r, logging to logger: its app.New
	// with cfg.Server.Role = r, on the test's database (and Pub/Sub).
	New func(r server.Role, logger *slog.Logger) (A, error)
	// APIOnly runs while only the api replica does: it sends work through
	// the API and asserts that no loop touched it.
	APIOnly func(t *testing.T, api A)
	// NotServedByWorker is an API request the worker replica must answer
	// 404; it is made after APIOnly, so it may name what APIOnly created.
	NotServedByWorker func() Request
	// WithWorker runs once a worker replica is ready too: it asserts that
	// the worker's loops did the waiting work.
	WithWorker func(t *testing.T, api, worker A)
}

// Run starts an api replica, runs APIOnly, checks that the api replica
// started no loop (its serving line says role api and 0 workers), starts a
// worker replica, checks that it serves no API, and runs WithWorker. Both
// replicas run until the test ends.
func Run[A App](t *testing.T, rs Replicas[A]) {
	t.Helper()
	api, apiLogs := Start(t, rs.New, server.RoleAPI)
	rs.APIOnly(t, api)
	// The server logged how many loops it started: none, by construction.
	if !strings.Contains(apiLogs.String(), `"role":"api"`) || !strings.Contains(apiLogs.String(), `"workers":0`) {
		t.Fatalf("api replica's serving line does not say role api with 0 workers:\n%s", apiLogs.String())
	}

	worker, _ := Start(t, rs.New, server.RoleWorker)
	if addr := worker.GRPCAddr(); addr != "" {
		t.Fatalf("worker replica bound gRPC at %s", addr)
	}
	wbase := "http://" + worker.HTTPAddr()
	req := rs.NotServedByWorker()
	if code, _ := Do(t, req.Method, wbase+req.Path, req.Body); code != http.StatusNotFound {
		t.Fatalf("worker replica %s %s = %d, want 404 (no REST API)", req.Method, req.Path, code)
	}
	if code, _ := Do(t, http.MethodGet, wbase+"/healthz", ""); code != http.StatusOK {
		t.Fatalf("worker /healthz = %d", code)
	}
	rs.WithWorker(t, api, worker)
}

// Start assembles the service in role r with newApp, runs it until the
// test ends (a Run error fails the test) and waits until it is ready; the
// returned logs are its own.
func Start[A App](t *testing.T, newApp func(server.Role, *slog.Logger) (A, error), r server.Role) (A, *Logs) {
	t.Helper()
	logs := &Logs{}
	a, err := newApp(r, slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("role %s: Run: %v", r, err)
		}
	})
	waitfor.Condition(t, 10*time.Second, string(r)+" ready", func() bool {
		code, _ := Do(t, http.MethodGet, "http://"+a.HTTPAddr()+"/readyz", "")
		return code == http.StatusOK
	})
	return a, logs
}

// Do makes an HTTP request and returns the status code and the body; code
// 0 and the error when the request got no response.
func Do(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Logs collects a replica's JSON log lines.
type Logs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
