package server_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// loopCounter is a worker that records that it ran.
func loopCounter(ran *atomic.Int32) server.Option {
	return server.WithWorker("loop", func(ctx context.Context) error {
		ran.Add(1)
		<-ctx.Done()
		return nil
	})
}

func TestRoleAPIServesTheAPIAndStartsNoWorker(t *testing.T) {
	t.Parallel()
	var ran atomic.Int32
	b := setupWith(t, server.Config{Role: server.RoleAPI}, loopCounter(&ran),
		server.WithHTTPHandler("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("m\n")) })))
	code := putOrder(t, b.base)
	if code != http.StatusOK || b.fake.calls.Load() != 1 {
		t.Fatalf("REST status %d, calls %d: want the API served", code, b.fake.calls.Load())
	}
	if code := httpStatus(t, b.base+"/metrics"); code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	if ran.Load() != 0 {
		t.Fatal("a worker ran in role api")
	}
}

func TestRoleWorkerRunsWorkersAndServesOnlyHealthAndMetrics(t *testing.T) {
	t.Parallel()
	var ran atomic.Int32
	b := setupWith(t, server.Config{Role: server.RoleWorker}, loopCounter(&ran),
		server.WithHTTPHandler("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("m\n")) })))
	waitfor.Condition(t, 5*time.Second, "worker started", func() bool { return ran.Load() == 1 })
	if addr := b.srv.GRPCAddr(); addr != "" {
		t.Fatalf("gRPC bound at %s in role worker", addr)
	}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 200} {
		if code := httpStatus(t, b.base+path); code != want {
			t.Errorf("GET %s = %d, want %d", path, code, want)
		}
	}
	code := putOrder(t, b.base)
	if code != http.StatusNotFound || b.fake.calls.Load() != 0 {
		t.Fatalf("POST /v1/orders = %d with %d calls, want 404 and none", code, b.fake.calls.Load())
	}
}

func TestInvalidRoleIsRefusedNamingTheVariable(t *testing.T) {
	t.Parallel()
	err := server.Config{GRPCAddr: ":0", HTTPAddr: ":0", Role: "both"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "SERVICE_ROLE") || !strings.Contains(err.Error(), "--role") {
		t.Fatalf("err = %v, want it to name SERVICE_ROLE and --role", err)
	}
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // test
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func putOrder(t *testing.T, base string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, base+"/v1/orders", strings.NewReader(validOrderJSON)) //nolint:noctx // test
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestParseServeFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args    []string
		want    server.Role
		wantErr string
	}{
		{nil, "", ""},
		{[]string{"--role=worker"}, server.RoleWorker, ""},
		{[]string{"-role", "api"}, server.RoleAPI, ""},
		{[]string{"--role=boss"}, "", `--role: role "boss"`},
		{[]string{"extra"}, "", `unexpected argument "extra"`},
		{[]string{"--verbose"}, "", "flag provided but not defined"},
	} {
		got, err := server.ParseServeFlags(tc.args)
		switch {
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("%q: %q, %v; want %q", tc.args, got, err, tc.want)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: error %v, want it to contain %q", tc.args, err, tc.wantErr)
		}
	}
}
