// Package iap verifies Google Cloud Identity-Aware Proxy's signed header,
// x-goog-iap-jwt-assertion: an ES256 JWT signed by IAP's keys, issued by
// https://cloud.google.com/iap, for the audience of the backend service
// the console sits behind. The console takes its e-mail claim as the
// principal (web.IdentityVerifier). The unsigned
// x-goog-authenticated-user-email header is never read: anything that
// reaches the console around the proxy could set it.
package iap

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/lossless-dev/lossless/pkg/server"
)

// Header carries IAP's signed assertion.
const Header = "x-goog-iap-jwt-assertion"

// Google's published values.
const (
	DefaultIssuer  = "https://cloud.google.com/iap"
	DefaultKeysURL = "https://www.gstatic.com/iap/verify/public_key-jwk"
)

// Config of a Verifier.
type Config struct {
	// Audience is the backend service's: "/projects/<project number>/global/backendServices/<service id>"
	// (or "/projects/<number>/apps/<project id>" for App Engine). Required.
	Audience string
	// Issuer, default DefaultIssuer; KeysURL, default DefaultKeysURL.
	// Tests point them at their own.
	Issuer, KeysURL string
	// Client fetches the keys; default http.DefaultClient.
	Client *http.Client
	// KeysTimeout bounds each fetch of the keys, whatever Client's own
	// timeout. Default 10s (server.KeyFetchTimeout).
	KeysTimeout time.Duration
}

// Verifier checks the assertion of each request.
type Verifier struct {
	v *oidc.IDTokenVerifier
}

// New returns a verifier. The keys are fetched on first use and again when
// a token names a key not yet seen (IAP rotates them), at most once per
// server.KeyRefetchInterval.
func New(cfg Config) (*Verifier, error) {
	if cfg.Audience == "" {
		return nil, errors.New("iap: Audience is required")
	}
	if cfg.Issuer == "" {
		cfg.Issuer = DefaultIssuer
	}
	if cfg.KeysURL == "" {
		cfg.KeysURL = DefaultKeysURL
	}
	if cfg.KeysTimeout < 0 {
		return nil, errors.New("iap: KeysTimeout must not be negative")
	}
	keys := server.NewKeySet(cfg.KeysURL, cfg.Client, cfg.KeysTimeout)
	return &Verifier{v: oidc.NewVerifier(cfg.Issuer, keys, &oidc.Config{
		ClientID: cfg.Audience, SupportedSigningAlgs: []string{oidc.ES256},
	})}, nil
}

// Verify returns the e-mail address IAP vouches for, or why it cannot.
func (v *Verifier) Verify(r *http.Request) (string, error) {
	raw := r.Header.Get(Header)
	if raw == "" {
		return "", fmt.Errorf("iap: no %s header: is the console reached around the proxy?", Header)
	}
	tok, err := v.v.Verify(r.Context(), raw)
	if err != nil {
		return "", fmt.Errorf("iap: %w", err)
	}
	var claims struct {
		Email string `json:"email"`
	}
	if err := tok.Claims(&claims); err != nil {
		return "", fmt.Errorf("iap: claims: %w", err)
	}
	if claims.Email == "" {
		return "", errors.New("iap: the assertion has no email claim")
	}
	return claims.Email, nil
}
