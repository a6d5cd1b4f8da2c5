package clientauth_test

import (
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/clientauth"
)

// Impersonation mints Google ID tokens: it cannot be combined with a token
// endpoint, and names a service account; either mistake is refused naming
// the variable.
func TestValidate_Impersonation(t *testing.T) {
	base := clientauth.Config{Audience: "https://workorder.example", AudienceVar: "WORKORDER_AUDIENCE"}
	ok := base
	ok.Impersonate = "demo@my-project.iam.gserviceaccount.com"
	if err := ok.Validate(); err != nil {
		t.Fatalf("a service account to impersonate: %v", err)
	}
	for name, c := range map[string]struct {
		cfg  clientauth.Config
		want string
	}{
		"with a token endpoint": {clientauth.Config{Audience: "a", AudienceVar: "X", Impersonate: ok.Impersonate,
			TokenURL: "http://127.0.0.1:1/token", ClientID: "c", ClientSecret: "s"}, "AUTH_IMPERSONATE and AUTH_TOKEN_URL are both set"},
		"not a service account": {clientauth.Config{Audience: "a", AudienceVar: "X", Impersonate: "alice@example.com"}, "AUTH_IMPERSONATE: \"alice@example.com\" is not a service account"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, c.want)
		}
	}
}
