package libenv_test

import (
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/server"
)

// AUTH_ISSUER and AUTH_JWKS_URL are https, except on loopback or with
// AUTH_ALLOW_HTTP; a refusal names the variable.
func TestCallerAuthKeyURLsAreHTTPSExceptOnLoopback(t *testing.T) {
	t.Parallel()
	read := func(env map[string]string) error {
		env["AUTH_AUDIENCE"] = "workorder"
		env["AUTH_CLIENTS"] = "demo=*"
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

// AUTH_CLIENTS is required unless AUTH_DISABLED, and a bad entry stops the
// start naming the variable.
func TestAuthClientsRequiredAndChecked(t *testing.T) {
	t.Parallel()
	base := map[string]string{"AUTH_ISSUER": "https://accounts.google.com", "AUTH_AUDIENCE": "workorder"}
	for _, clients := range []string{"", "=cust-a", "demo=", "demo=a,demo=b", "demo=*|a", "demo"} {
		env := map[string]string{"AUTH_CLIENTS": clients}
		for k, v := range base {
			env[k] = v
		}
		err := libenv.ReadCallerAuth(envconfig.FromMap(env)).Validate()
		if err == nil || !strings.Contains(err.Error(), "AUTH_CLIENTS") {
			t.Errorf("AUTH_CLIENTS=%q: %v, want an error naming AUTH_CLIENTS", clients, err)
		}
	}
	base["AUTH_CLIENTS"] = "demo=*, shop@x.iam.gserviceaccount.com = cust-a | cust-b"
	c := libenv.ReadCallerAuth(envconfig.FromMap(base))
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	cs, err := c.AuthorizedClients()
	if err != nil {
		t.Fatal(err)
	}
	shop, ok := cs.Lookup(server.Caller{Subject: "1234", Email: "shop@x.iam.gserviceaccount.com"})
	if !ok || shop.All() || !shop.Has("cust-b") || shop.Has("cust-c") {
		t.Fatalf("shop's customers %v %v, want cust-a|cust-b", shop, ok)
	}
	if err := c.ValidateIdentity(); err != nil {
		t.Fatal(err)
	}
}

// With authentication off, the anonymous caller acts for every customer
// and AUTH_CLIENTS is not required.
func TestAuthDisabledAnonymousActsForEveryCustomer(t *testing.T) {
	t.Parallel()
	c := libenv.ReadCallerAuth(envconfig.FromMap(map[string]string{"AUTH_DISABLED": "true"}))
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	cs, err := c.AuthorizedClients()
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := cs.Lookup(server.AnonymousCaller); !ok || !got.All() {
		t.Fatalf("anonymous: %v %v, want every customer", got, ok)
	}
}
