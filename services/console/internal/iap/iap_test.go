package iap_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/lossless-dev/lossless/services/console/internal/iap"
)

const (
	issuer   = "https://cloud.google.com/iap"
	audience = "/projects/123456/global/backendServices/7890"
)

// proxy stands in for IAP: its key set served over HTTP, and assertions
// signed with its key (or another).
type proxy struct {
	key, other *ecdsa.PrivateKey
	keys       *httptest.Server
}

func newProxy(t *testing.T) *proxy {
	t.Helper()
	p := &proxy{}
	var err error
	if p.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if p.other, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &p.key.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}}
	p.keys = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(p.keys.Close)
	return p
}

func (p *proxy) sign(t *testing.T, key *ecdsa.PrivateKey, alg jose.SignatureAlgorithm, c jwt.Claims, email string) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := jwt.Signed(s).Claims(c).Claims(map[string]any{"email": email}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestVerify(t *testing.T) {
	p := newProxy(t)
	v, err := iap.New(iap.Config{Audience: audience, KeysURL: p.keys.URL})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	good := jwt.Claims{Issuer: issuer, Audience: jwt.Audience{audience}, Subject: "accounts.google.com:1",
		IssuedAt: jwt.NewNumericDate(now.Add(-time.Minute)), Expiry: jwt.NewNumericDate(now.Add(9 * time.Minute))}
	req := func(assertion string) *http.Request {
		r := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/", nil)
		if assertion != "" {
			r.Header.Set(iap.Header, assertion)
		}
		// The unsigned header IAP also sets is never believed.
		r.Header.Set("x-goog-authenticated-user-email", "accounts.google.com:mallory@example.com")
		return r
	}
	if id, err := v.Verify(req(p.sign(t, p.key, jose.ES256, good, "alice@example.com"))); err != nil || id != "alice@example.com" {
		t.Fatalf("valid assertion: %q, %v; want alice@example.com", id, err)
	}
	wrongAud, wrongIss, expired := good, good, good
	wrongAud.Audience = jwt.Audience{"/projects/123456/global/backendServices/1"}
	wrongIss.Issuer = "https://accounts.google.com"
	expired.Expiry = jwt.NewNumericDate(now.Add(-time.Minute))
	for name, a := range map[string]string{
		"no header":       "",
		"garbage":         "not.a.jwt",
		"another key":     p.sign(t, p.other, jose.ES256, good, "alice@example.com"),
		"another backend": p.sign(t, p.key, jose.ES256, wrongAud, "alice@example.com"),
		"another issuer":  p.sign(t, p.key, jose.ES256, wrongIss, "alice@example.com"),
		"expired":         p.sign(t, p.key, jose.ES256, expired, "alice@example.com"),
		"no email":        p.sign(t, p.key, jose.ES256, good, ""),
	} {
		if id, err := v.Verify(req(a)); err == nil || id != "" {
			t.Errorf("%s: identity %q, error %v; want refused", name, id, err)
		} else if !strings.HasPrefix(err.Error(), "iap:") {
			t.Errorf("%s: error %v, want one saying iap", name, err)
		}
	}
	if _, err := iap.New(iap.Config{}); err == nil {
		t.Fatal("a verifier without an audience")
	}
}

// A key server that never answers fails the verification within
// KeysTimeout, even for a request without a deadline.
func TestKeyFetchTimesOut(t *testing.T) {
	p := newProxy(t)
	stop := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(stop) })
	v, err := iap.New(iap.Config{Audience: audience, KeysURL: hang.URL, KeysTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r := httptest.NewRequestWithContext(context.Background(), http.MethodGet, "/", nil)
	r.Header.Set(iap.Header, p.sign(t, p.key, jose.ES256, jwt.Claims{Issuer: issuer, Audience: jwt.Audience{audience},
		IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Minute))}, "alice@example.com"))
	done := make(chan error, 1)
	go func() { _, err := v.Verify(r); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("verified without keys")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Verify still waiting for the keys after 10s")
	}
}
