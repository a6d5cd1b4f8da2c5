package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/devtools/localca"
	"github.com/lossless-dev/lossless/internal/envconfig"
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
			if got := run(ctx, tc.args, &stderr, envconfig.FromMap(nil)); got != tc.wantCode {
				t.Fatalf("exit code %d, want %d (stderr %q)", got, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantErr) {
				t.Fatalf("stderr %q does not contain %q", stderr.String(), tc.wantErr)
			}
		})
	}
}

// TestRunVerifiesHTTPSWithTheServicesCA: an https:// probe trusts the
// service's TLS_CA_FILE, and fails against a server of another CA.
func TestRunVerifiesHTTPSWithTheServicesCA(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, err := localca.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue("svc")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	other, err := localca.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		env      map[string]string
		wantCode int
		wantErr  string
	}{
		"the service's CA":          {map[string]string{"TLS_CA_FILE": ca.CAFile()}, 0, ""},
		"with a client certificate": {map[string]string{"TLS_CA_FILE": ca.CAFile(), "TLS_CERT_FILE": pair.CertFile, "TLS_KEY_FILE": pair.KeyFile}, 0, ""},
		"another CA":                {map[string]string{"TLS_CA_FILE": other.CAFile()}, 1, "certificate"},
		"a missing CA file":         {map[string]string{"TLS_CA_FILE": dir + "/nope.crt"}, 1, "TLS_CA_FILE"},
	} {
		var stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got := run(ctx, []string{srv.URL + "/readyz"}, &stderr, envconfig.FromMap(tc.env))
		cancel()
		if got != tc.wantCode || !strings.Contains(stderr.String(), tc.wantErr) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", name, got, stderr.String(), tc.wantCode, tc.wantErr)
		}
	}
}
