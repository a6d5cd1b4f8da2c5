package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			_, _ = w.Write([]byte("ok"))
		case "/slow":
			<-r.Context().Done()
		default:
			http.Error(w, "database: connection refused", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"ready", []string{srv.URL + "/readyz"}, 0, ""},
		{"not ready keeps the reason", []string{srv.URL + "/other"}, 1, "database: connection refused"},
		{"hung endpoint times out", []string{"-timeout", "50ms", srv.URL + "/slow"}, 1, "deadline exceeded"},
		{"nothing listening", []string{"http://127.0.0.1:1/readyz"}, 1, "connection refused"},
		{"not a URL", []string{"127.0.0.1:8080"}, 1, "not an http(s) URL"},
		{"no argument", nil, 1, "usage"},
		{"two arguments", []string{srv.URL, srv.URL}, 1, "usage"},
		{"bad timeout", []string{"-timeout", "0s", srv.URL + "/readyz"}, 1, "timeout must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if got := run(ctx, tc.args, &stderr); got != tc.wantCode {
				t.Fatalf("exit code %d, want %d (stderr %q)", got, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantErr) {
				t.Fatalf("stderr %q does not contain %q", stderr.String(), tc.wantErr)
			}
		})
	}
}
