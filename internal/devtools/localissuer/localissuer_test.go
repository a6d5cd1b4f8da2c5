package localissuer_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/devtools/localissuer"
	"github.com/lossless-dev/lossless/pkg/server"
)

// start serves an issuer with one client on loopback.
func start(t *testing.T) *localissuer.Issuer {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	is, err := localissuer.New("http://"+srv.Listener.Addr().String(), map[string]localissuer.Client{
		"workorder": {Secret: "s3cret", Audiences: []string{"provider-sim", "x", "https://billing.lossless.svc"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = is.Handler()
	srv.Start()
	t.Cleanup(srv.Close)
	return is
}

// A client's token, fetched by the client-credentials grant as the services
// fetch theirs, is accepted by pkg/server's verifier (discovery and JWKS
// over HTTP) for its audience only, with the client id as subject.
func TestClientCredentialsTokenVerifiesForItsAudience(t *testing.T) {
	t.Parallel()
	is := start(t)
	ts, err := clientauth.Config{TokenURL: is.TokenURL(), ClientID: "workorder", ClientSecret: "s3cret",
		Audience: "provider-sim", AudienceVar: "PROVIDER_AUDIENCE"}.TokenSource(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ts.Token()
	if err != nil {
		t.Fatal(err)
	}
	for aud, wantOK := range map[string]bool{"provider-sim": true, "workorder": false} {
		v, err := server.NewOIDCVerifier(server.OIDCConfig{Issuer: is.URL(), Audience: aud}, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := v.Authenticate(context.Background(), tok.AccessToken)
		if (err == nil) != wantOK || (wantOK && c.Subject != "workorder") {
			t.Errorf("audience %s: caller %+v, error %v; want accepted=%v as workorder", aud, c, err, wantOK)
		}
	}
}

func TestTokenEndpointRefusesBadClientsAndRequests(t *testing.T) {
	t.Parallel()
	is := start(t)
	for name, c := range map[string]struct {
		form url.Values
		want int
	}{
		"wrong secret":      {url.Values{"grant_type": {"client_credentials"}, "client_id": {"workorder"}, "client_secret": {"guess"}, "audience": {"x"}}, http.StatusUnauthorized},
		"unknown client":    {url.Values{"grant_type": {"client_credentials"}, "client_id": {"intruder"}, "client_secret": {"s3cret"}, "audience": {"x"}}, http.StatusUnauthorized},
		"no audience":       {url.Values{"grant_type": {"client_credentials"}, "client_id": {"workorder"}, "client_secret": {"s3cret"}}, http.StatusBadRequest},
		"unlisted audience": {url.Values{"grant_type": {"client_credentials"}, "client_id": {"workorder"}, "client_secret": {"s3cret"}, "audience": {"workorder"}}, http.StatusBadRequest},
		"audience prefix":   {url.Values{"grant_type": {"client_credentials"}, "client_id": {"workorder"}, "client_secret": {"s3cret"}, "audience": {"https://billing"}}, http.StatusBadRequest},
		"other grant type":  {url.Values{"grant_type": {"password"}, "client_id": {"workorder"}, "client_secret": {"s3cret"}, "audience": {"x"}}, http.StatusBadRequest},
	} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, is.TokenURL(), strings.NewReader(c.form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: HTTP %d, want %d", name, resp.StatusCode, c.want)
		}
	}
}

func TestParseClients(t *testing.T) {
	t.Parallel()
	c, err := localissuer.ParseClients(" a:1:workorder|billing, b:2:https://provider-sim.lossless.svc ,")
	if err != nil || len(c) != 2 || c["a"].Secret != "1" || !slices.Equal(c["a"].Audiences, []string{"workorder", "billing"}) ||
		c["b"].Secret != "2" || !slices.Equal(c["b"].Audiences, []string{"https://provider-sim.lossless.svc"}) ||
		localissuer.FormatClients(c) != "a:1:workorder|billing,b:2:https://provider-sim.lossless.svc" {
		t.Fatalf("ParseClients = %v, %v", c, err)
	}
	for _, bad := range []string{"", "a", "a:", ":1", "a:1", "a:1:", "a:1:x||y", ":1:x", "a::x"} {
		if _, err := localissuer.ParseClients(bad); err == nil {
			t.Errorf("ParseClients(%q) accepted", bad)
		}
	}
}

// A registered client asking for an audience it is not registered for gets
// the OAuth error invalid_target, and no token; its own audiences still work.
func TestTokenEndpointRefusesAudiencesTheClientIsNotRegisteredFor(t *testing.T) {
	t.Parallel()
	is := start(t)
	get := func(aud string) (int, map[string]any) {
		form := url.Values{"grant_type": {"client_credentials"}, "audience": {aud}}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, is.TokenURL(), strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth("workorder", "s3cret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body
	}
	if code, body := get("billing"); code != http.StatusBadRequest || body["error"] != "invalid_target" || body["id_token"] != nil {
		t.Errorf("audience billing: HTTP %d %v, want 400 invalid_target without a token", code, body)
	}
	if code, body := get("https://billing.lossless.svc"); code != http.StatusOK || body["id_token"] == nil {
		t.Errorf("registered audience: HTTP %d %v, want 200 with an id_token", code, body)
	}
	// clientauth surfaces the refusal instead of a token.
	ts, err := clientauth.Config{TokenURL: is.TokenURL(), ClientID: "workorder", ClientSecret: "s3cret",
		Audience: "workorder", AudienceVar: "WORKORDER_AUDIENCE"}.TokenSource(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := ts.Token(); err == nil || !strings.Contains(err.Error(), "invalid_target") {
		t.Errorf("token for an unregistered audience: %v, %v; want an invalid_target error", tok, err)
	}
}
