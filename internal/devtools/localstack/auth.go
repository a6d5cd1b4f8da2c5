package localstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/devtools/localissuer"
)

// DemoClient is the client id (and so the caller subject) of the stack's
// local issuer for whoever drives the stack from outside: make demo, the
// load generator, the end-to-end tests, curl (Stack.ClientSecret).
const DemoClient = "demo"

// OperatorClient is the local operator (`make ops`; it may get tokens for
// every service): every service lists it in AUTH_OPERATORS, so an operator command with OPERATOR_TOKEN_URL,
// OPERATOR_CLIENT_ID=operator and its secret (Stack.ClientSecret) runs as
// it. ConsoleClient is the console's identity, listed in AUTH_CONSOLES.
const (
	OperatorClient = "operator"
	ConsoleClient  = "console"
)

// issuer is the stack's OpenID Connect issuer (internal/devtools/localissuer),
// served in this process on loopback: every service verifies its callers'
// tokens against it (discovery and JWKS over HTTP) and gets its own tokens
// from it (client credentials, its name as client id and subject).
type issuer struct {
	*localissuer.Issuer
	srv     *http.Server
	secrets map[string]string // client id -> secret
}

// clientAudiences are the audiences each client of the stack's issuer may
// get tokens for: the services it calls. services are the stack's service
// names (each its own audience).
func clientAudiences(services []string) map[string][]string {
	has := func(name string) []string {
		if slices.Contains(services, name) {
			return []string{name}
		}
		return nil
	}
	auds := map[string][]string{
		// The public APIs of orders and invoices (make demo, the load
		// generator, the end-to-end tests, curl).
		DemoClient:     append(has("workorder"), has("billing")...),
		OperatorClient: slices.Clone(services),
	}
	for _, svc := range services {
		auds[svc] = nil
	}
	// The work-order service hands work to the provider; billing's reconcile
	// command reads orders; the console reads and acts on every service.
	auds["workorder"] = has("provider-sim")
	auds["billing"] = has("workorder")
	auds["console"] = slices.Clone(services)
	return auds
}

// startIssuer serves the issuer on 127.0.0.1:port with a client per
// service, DemoClient and OperatorClient, each with a random secret and
// the audiences of clientAudiences.
func (s *Stack) startIssuer(port int) error {
	var names []string
	for _, svc := range s.cfg.Services {
		names = append(names, svc.Name)
	}
	clients := map[string]localissuer.Client{}
	secrets := map[string]string{}
	for id, auds := range clientAudiences(names) {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		secrets[id] = hex.EncodeToString(b)
		clients[id] = localissuer.Client{Secret: secrets[id], Audiences: auds}
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", addr)
	if err != nil {
		return fmt.Errorf("localstack: issuer: %w", err)
	}
	is, err := localissuer.New("http://"+addr, clients)
	if err != nil {
		_ = lis.Close()
		return err
	}
	srv := &http.Server{Handler: is.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	s.issuer = &issuer{Issuer: is, srv: srv, secrets: secrets}
	s.logf("issuer", "OIDC issuer on %s", is.URL())
	return nil
}

func (s *Stack) stopIssuer() {
	if s.issuer != nil {
		_ = s.issuer.srv.Close()
	}
}

// Clients is the stack's AUTH_CLIENTS (docs/adr/0025-authorization.md):
// DemoClient (make demo, the load generator, the end-to-end tests) and
// the console, which reads billing's invoices for its operators, act for
// every customer.
const Clients = DemoClient + "=*,console=*"

// authEnv is a service's caller authentication: its audience is its name,
// its identity the client of that name (docs/adr/0017-caller-identity.md),
// its clients Clients, its operators the local OperatorClient and
// ConsoleClient.
func (s *Stack) authEnv(service string) []string {
	return []string{
		"AUTH_ISSUER=" + s.issuer.URL(),
		"AUTH_AUDIENCE=" + service,
		"AUTH_CLIENTS=" + Clients,
		"AUTH_TOKEN_URL=" + s.issuer.TokenURL(),
		"AUTH_CLIENT_ID=" + service,
		"AUTH_CLIENT_SECRET=" + s.issuer.secrets[service],
		"AUTH_OPERATORS=" + OperatorClient,
		"AUTH_CONSOLES=" + ConsoleClient,
	}
}

// IssuerURL is the URL of the stack's OIDC issuer (the tokens' iss).
func (s *Stack) IssuerURL() string { return s.issuer.URL() }

// TokenURL is the issuer's client-credentials endpoint.
func (s *Stack) TokenURL() string { return s.issuer.TokenURL() }

// ClientSecret is the secret of client id (DemoClient, OperatorClient, or a
// service name).
func (s *Stack) ClientSecret(id string) string { return s.issuer.secrets[id] }

// Caller is DemoClient's token configuration for the service named
// audience (e.g. "workorder").
func (s *Stack) Caller(audience string) clientauth.Config {
	return clientauth.Config{TokenURL: s.issuer.TokenURL(), ClientID: DemoClient,
		ClientSecret: s.issuer.secrets[DemoClient], Audience: audience, AudienceVar: "audience"}
}

// CallerHTTPClient is base (nil: HTTPClient's, TLS when the stack runs it)
// calling the work-order API as DemoClient: every request carries its ID
// token.
func (s *Stack) CallerHTTPClient(base *http.Client) (*http.Client, error) {
	if s.issuer == nil {
		return nil, errors.New("localstack: the stack has no issuer")
	}
	if base == nil {
		base = s.HTTPClient(0)
	}
	return s.Caller("workorder").HTTPClient(context.Background(), base)
}
