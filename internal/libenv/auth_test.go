package libenv_test

import (
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
)

// AUTH_ISSUER and AUTH_JWKS_URL are https, except on loopback or with
// AUTH_ALLOW_HTTP; a refusal names the variable.
func TestCallerAuthKeyURLsAreHTTPSExceptOnLoopback(t *testing.T) {
	t.Parallel()
	read := func(env map[string]string) error {
		env["AUTH_AUDIENCE"] = "workorder"
		r := envconfig.FromMap(env)
		c := libenv.ReadCallerAuth(r)
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		return c.Validate()
	}
	err := read(map[string]string{"AUTH_ISSUER": "http://issuer.internal:8086"})
	if err == nil || !strings.Contains(err.Error(), "AUTH_ISSUER") {
		t.Errorf("http issuer: %v, want refused naming AUTH_ISSUER", err)
	}
	err = read(map[string]string{"AUTH_ISSUER": "https://accounts.google.com", "AUTH_JWKS_URL": "http://keys.internal/jwks"})
	if err == nil || !strings.Contains(err.Error(), "AUTH_JWKS_URL") {
		t.Errorf("http JWKS URL: %v, want refused naming AUTH_JWKS_URL", err)
	}
	for _, env := range []map[string]string{
		{"AUTH_ISSUER": "https://accounts.google.com"},
		{"AUTH_ISSUER": "http://127.0.0.1:8086", "AUTH_JWKS_URL": "http://localhost:8086/jwks"},
		{"AUTH_ISSUER": "http://localissuer:8086", "AUTH_ALLOW_HTTP": "true"},
	} {
		if err := read(env); err != nil {
			t.Errorf("%v: %v, want accepted", env, err)
		}
	}
}
