package clientauth_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/envconfig"
)

// With TLS configured (TLS_CA_FILE or TLS_CERT_FILE), tokens go over TLS
// only.
func TestFromEnvRequiresTLSWhenTLSIsConfigured(t *testing.T) {
	t.Parallel()
	for env, want := range map[string]bool{"": false, "TLS_CA_FILE": true, "TLS_CERT_FILE": true} {
		m := map[string]string{}
		if env != "" {
			m[env] = "/etc/tls/file.pem"
		}
		if got := clientauth.FromEnv(envconfig.FromMap(m), "WORKORDER_AUDIENCE", "workorder").RequireTLS; got != want {
			t.Errorf("%q set: RequireTLS %v, want %v", env, got, want)
		}
	}
}

func TestRequireTLSRefusesPlaintextConnections(t *testing.T) {
	t.Parallel()
	var tokens atomic.Int32
	issuer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		tokens.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"access_token":"a","token_type":"Bearer","id_token":"id","expires_in":3600}`))
	}))
	t.Cleanup(issuer.Close)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(api.Close)
	c := clientauth.Config{TokenURL: issuer.URL, ClientID: "demo", ClientSecret: "s", Audience: "workorder", RequireTLS: true}
	ctx := context.Background()

	opt, err := c.DialOption(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()), opt); err == nil {
		_ = conn.Close()
		t.Fatal("a plaintext gRPC connection was built with credentials that require TLS")
	}
	hc, err := c.HTTPClient(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(api.URL) //nolint:noctx // test
	if err == nil {
		resp.Body.Close()
		t.Fatal("a token was sent to an http URL")
	}
	if !strings.Contains(err.Error(), "https") || tokens.Load() != 0 {
		t.Fatalf("http URL: %v, %d tokens minted; want refused before a token", err, tokens.Load())
	}

	c.RequireTLS = false
	if hc, err = c.HTTPClient(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if resp, err := hc.Get(api.URL); err != nil { //nolint:noctx // test
		t.Fatalf("without TLS configured: %v", err)
	} else {
		resp.Body.Close()
	}
}
