package libenv

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/server"
)

// Environment variables of caller authentication (CallerAuth).
const (
	EnvAuthDisabled = "AUTH_DISABLED"
	EnvAuthIssuer   = "AUTH_ISSUER"
	EnvAuthAudience = "AUTH_AUDIENCE"
	EnvAuthJWKSURL  = "AUTH_JWKS_URL"
	// EnvAuthAllowHTTP accepts http:// AUTH_ISSUER and AUTH_JWKS_URL on
	// hosts other than loopback: a private development network only.
	EnvAuthAllowHTTP = "AUTH_ALLOW_HTTP"
	EnvAuthClients   = "AUTH_CLIENTS"
)

// CallerAuth is how a service authenticates the callers of its public API
// (pkg/server WithCallerAuth, docs/adr/0017-caller-identity.md).
type CallerAuth struct {
	// Disabled accepts every call as server.AnonymousCaller (env
	// AUTH_DISABLED, default false). Only for benchmarks of the data path:
	// every caller is then the same one. The default is on wherever the
	// service runs, so a forgotten variable fails the start, not open.
	Disabled bool
	// OIDC names the accepted ID tokens: AUTH_ISSUER (e.g.
	// https://accounts.google.com) and AUTH_AUDIENCE (this service's
	// audience), both required unless AUTH_DISABLED; AUTH_JWKS_URL
	// (default "": from the issuer's discovery document). Both https,
	// except on a loopback host or with AUTH_ALLOW_HTTP=true (default
	// false; compose and the local overlay, whose issuer is a container).
	OIDC server.OIDCConfig
	// Clients are the callers of the public API and the customers each may
	// act for (env AUTH_CLIENTS, authz.ParseClients: "id=cust-a|cust-b,
	// other-id=*", an id being a token subject or verified email; "*" is
	// every customer, for a trusted intake such as the load generator).
	// Required unless AUTH_DISABLED: a verified caller not listed is refused
	// on every public RPC (docs/adr/0025-authorization.md).
	Clients string
}

// ReadCallerAuth reads AUTH_DISABLED, AUTH_ISSUER, AUTH_AUDIENCE,
// AUTH_JWKS_URL, AUTH_ALLOW_HTTP and AUTH_CLIENTS. Check r.Err() and
// Validate afterwards.
func ReadCallerAuth(r *envconfig.Reader) CallerAuth {
	return CallerAuth{
		Disabled: r.Bool(EnvAuthDisabled, false),
		OIDC: server.OIDCConfig{
			Issuer:    r.String(EnvAuthIssuer, ""),
			Audience:  r.String(EnvAuthAudience, ""),
			JWKSURL:   r.String(EnvAuthJWKSURL, ""),
			AllowHTTP: r.Bool(EnvAuthAllowHTTP, false),
		},
		Clients: r.String(EnvAuthClients, ""),
	}
}

// Validate reports missing or bad settings, naming the variables: those of
// ValidateIdentity, and AUTH_CLIENTS (required unless AUTH_DISABLED).
func (c CallerAuth) Validate() error {
	if c.Disabled {
		return nil
	}
	errs := []error{c.ValidateIdentity()}
	if strings.TrimSpace(c.Clients) == "" {
		errs = append(errs, fmt.Errorf("%s: required (the clients of the public API and their customers: id=cust-a|cust-b,other-id=*), or %s=true",
			EnvAuthClients, EnvAuthDisabled))
	} else if _, err := authz.ParseClients(c.Clients); err != nil {
		errs = append(errs, envconfig.Check(EnvAuthClients, err))
	}
	return errors.Join(errs...)
}

// AuthorizedClients returns the parsed AUTH_CLIENTS. With AUTH_DISABLED,
// the anonymous caller acts for every customer.
func (c CallerAuth) AuthorizedClients() (authz.Clients, error) {
	if c.Disabled {
		return authz.Clients{server.AnonymousCaller.Subject: authz.All()}, nil
	}
	cs, err := authz.ParseClients(c.Clients)
	if err != nil {
		return nil, envconfig.Check(EnvAuthClients, err)
	}
	return cs, nil
}

// ValidateIdentity reports missing or bad settings of authentication alone
// (AUTH_ISSUER, AUTH_AUDIENCE, AUTH_JWKS_URL), for a service whose API has
// peers and operators but no clients (provider-sim).
func (c CallerAuth) ValidateIdentity() error {
	if c.Disabled {
		return nil
	}
	var errs []error
	if c.OIDC.Issuer == "" {
		errs = append(errs, fmt.Errorf("%s: required (the issuer of the callers' ID tokens, e.g. https://accounts.google.com), or %s=true", EnvAuthIssuer, EnvAuthDisabled))
	}
	if c.OIDC.Audience == "" {
		errs = append(errs, fmt.Errorf("%s: required (this service's audience: tokens minted for another service are refused)", EnvAuthAudience))
	}
	if c.OIDC.Issuer != "" {
		if err := server.CheckKeyURL(c.OIDC.Issuer, c.OIDC.AllowHTTP); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w (or %s=true on a private development network)", EnvAuthIssuer, err, EnvAuthAllowHTTP))
		}
	}
	if c.OIDC.JWKSURL != "" {
		if err := server.CheckKeyURL(c.OIDC.JWKSURL, c.OIDC.AllowHTTP); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w (or %s=true on a private development network)", EnvAuthJWKSURL, err, EnvAuthAllowHTTP))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return envconfig.Check(EnvAuthIssuer+" / "+EnvAuthAudience+" / "+EnvAuthJWKSURL, c.OIDC.Validate())
}

// Option is the server option that authenticates the public API's callers,
// every gRPC service but the exempt ones (full names: the operator
// services, which the operator token guards).
func (c CallerAuth) Option(logger *slog.Logger, exempt ...string) (server.Option, error) {
	if c.Disabled {
		logger.Warn("caller authentication is off (" + EnvAuthDisabled + "=true): every call is accepted as one anonymous caller")
		return server.WithCallerAuth(server.AnonymousAuthenticator{}, exempt...), nil
	}
	v, err := server.NewOIDCVerifier(c.OIDC, nil)
	if err != nil {
		return nil, fmt.Errorf("%s / %s: %w", EnvAuthIssuer, EnvAuthAudience, err)
	}
	return server.WithCallerAuth(v, exempt...), nil
}

// SplitSubjects splits a comma-separated list of callers (subjects or
// verified emails, e.g. WORKORDER_OPERATOR_SUBJECTS), blanks dropped.
func SplitSubjects(list string) []string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
