// Package clientauth gives a process that calls a lossless API the ID
// tokens the API's caller authentication (pkg/server WithCallerAuth)
// verifies, read from the environment:
//
//   - AUTH_TOKEN_URL set: the OAuth 2.0 client-credentials grant against
//     that token endpoint with AUTH_CLIENT_ID and AUTH_CLIENT_SECRET (the
//     local issuer of `make run`, compose and the tests,
//     internal/devtools/localissuer); the caller's subject is its client id.
//   - AUTH_TOKEN_URL unset: Google-signed ID tokens of the workload's
//     service account, from the GKE / GCE metadata server (Workload
//     Identity); the caller's subject is the service account's unique id.
//   - AUTH_IMPERSONATE set (a service account's email): Google-signed ID
//     tokens of that account, minted through the IAM Credentials API with
//     the ambient credentials, such as a person's `gcloud auth
//     application-default login`, which cannot mint ID tokens for an
//     audience of their own (the person needs Service Account Token Creator
//     on the account). How a person calls the GKE deployment from outside
//     it; `make demo-gcp` runs in the cluster with Workload Identity instead.
//
// Either way the token is minted for one audience, the called service's
// (its AUTH_AUDIENCE), named by a variable of the caller (PROVIDER_AUDIENCE,
// WORKORDER_AUDIENCE), and cached until shortly before it expires.
package clientauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
	"google.golang.org/api/idtoken"
	"google.golang.org/api/impersonate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/server"
)

// Environment variables read by FromEnv.
const (
	EnvTokenURL     = "AUTH_TOKEN_URL"
	EnvClientID     = "AUTH_CLIENT_ID"
	EnvClientSecret = "AUTH_CLIENT_SECRET"
	EnvImpersonate  = "AUTH_IMPERSONATE"
)

// Config of one caller's tokens for one called service.
type Config struct {
	// Disabled sends no token (env AUTH_DISABLED=true, which also switches
	// the process's own caller authentication off: a stack run without
	// authentication, for benchmarks only). Default false.
	Disabled bool
	// TokenURL is the client-credentials endpoint (env AUTH_TOKEN_URL).
	// Default "": Google ID tokens from the metadata server.
	TokenURL string
	// ClientID and ClientSecret authenticate the caller to TokenURL (env
	// AUTH_CLIENT_ID, AUTH_CLIENT_SECRET; required with TokenURL).
	ClientID     string
	ClientSecret string
	// Impersonate is a Google service account whose ID tokens the ambient
	// credentials mint (env AUTH_IMPERSONATE). Default "": the ambient
	// credentials' own. Not with TokenURL.
	Impersonate string
	// Audience is the called service's AUTH_AUDIENCE, read from
	// AudienceVar. Required.
	Audience    string
	AudienceVar string
	// RequireTLS refuses to send a token on a connection without TLS.
	// FromEnv sets it whenever the process dials with TLS (TLS_CA_FILE or
	// TLS_CERT_FILE set), so a token never falls back to plaintext; false
	// only where the process has no TLS at all (a trusted network).
	RequireTLS bool
}

// FromEnv reads the token settings, the audience from audienceVar (default
// defaultAudience). Check r.Err() and Validate afterwards.
func FromEnv(r *envconfig.Reader, audienceVar, defaultAudience string) Config {
	return Config{
		Disabled:     r.Bool("AUTH_DISABLED", false),
		TokenURL:     r.String(EnvTokenURL, ""),
		ClientID:     r.String(EnvClientID, ""),
		ClientSecret: r.String(EnvClientSecret, ""),
		Impersonate:  r.String(EnvImpersonate, ""),
		Audience:     r.String(audienceVar, defaultAudience),
		AudienceVar:  audienceVar,
		// The process dials with TLS (libenv.TLS's TLS_CA_FILE or
		// TLS_CERT_FILE); read by name, as libenv carries every service's
		// variables and a caller of this package needs none of them.
		RequireTLS: r.String("TLS_CA_FILE", "") != "" || r.String("TLS_CERT_FILE", "") != "",
	}
}

// Validate reports missing settings, naming the variables.
func (c Config) Validate() error {
	if c.Disabled {
		return nil
	}
	var errs []error
	if c.Audience == "" {
		errs = append(errs, fmt.Errorf("%s: must not be empty: the called service's AUTH_AUDIENCE", c.AudienceVar))
	}
	if c.Impersonate != "" && c.TokenURL != "" {
		errs = append(errs, fmt.Errorf("%s and %s are both set: impersonation mints Google ID tokens, the token endpoint its own; set one",
			EnvImpersonate, EnvTokenURL))
	}
	if c.Impersonate != "" && !strings.HasSuffix(c.Impersonate, ".gserviceaccount.com") {
		errs = append(errs, fmt.Errorf("%s: %q is not a service account's email (<name>@<project>.iam.gserviceaccount.com)", EnvImpersonate, c.Impersonate))
	}
	if c.TokenURL == "" {
		if c.ClientID != "" || c.ClientSecret != "" {
			errs = append(errs, fmt.Errorf("%s / %s are set without %s: set the token endpoint, or unset them to use Google ID tokens",
				EnvClientID, EnvClientSecret, EnvTokenURL))
		}
		return errors.Join(errs...)
	}
	if u, err := url.Parse(c.TokenURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("%s: %q is not an http(s) URL", EnvTokenURL, c.TokenURL))
	}
	if c.ClientID == "" || c.ClientSecret == "" {
		errs = append(errs, fmt.Errorf("%s and %s are required with %s", EnvClientID, EnvClientSecret, EnvTokenURL))
	}
	return errors.Join(errs...)
}

// TokenSource returns a cached source of ID tokens for c.Audience, in the
// tokens' AccessToken (an error when Disabled). ctx must outlive the
// source: it carries the HTTP client
// (oauth2.HTTPClient) for the token requests.
func (c Config) TokenSource(ctx context.Context) (oauth2.TokenSource, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Impersonate != "" {
		ts, err := impersonate.IDTokenSource(ctx, impersonate.IDTokenConfig{
			Audience: c.Audience, TargetPrincipal: c.Impersonate, IncludeEmail: true})
		if err != nil {
			return nil, fmt.Errorf("clientauth: ID tokens of %s (%s) for %s: %w", c.Impersonate, EnvImpersonate, c.Audience, err)
		}
		return ts, nil
	}
	if c.TokenURL == "" {
		ts, err := idtoken.NewTokenSource(ctx, c.Audience)
		if err != nil {
			return nil, fmt.Errorf("clientauth: Google ID tokens for %s (%s unset): %w", c.Audience, EnvTokenURL, err)
		}
		return ts, nil
	}
	cc := clientcredentials.Config{
		ClientID: c.ClientID, ClientSecret: c.ClientSecret, TokenURL: c.TokenURL,
		EndpointParams: url.Values{"audience": {c.Audience}},
	}
	return oauth2.ReuseTokenSource(nil, idTokens{cc.TokenSource(ctx)}), nil
}

// idTokens takes the id_token of a token response as the bearer token.
type idTokens struct{ src oauth2.TokenSource }

func (s idTokens) Token() (*oauth2.Token, error) {
	t, err := s.src.Token()
	if err != nil {
		return nil, err
	}
	id, _ := t.Extra("id_token").(string)
	if id == "" {
		return nil, errors.New("clientauth: the token response has no id_token")
	}
	return &oauth2.Token{AccessToken: id, TokenType: "Bearer", Expiry: t.Expiry}, nil
}

// DialOption sends the tokens on every call of a gRPC connection; with
// RequireTLS only on a TLS connection (a call on another fails).
func (c Config) DialOption(ctx context.Context) (grpc.DialOption, error) {
	creds, err := c.PerRPCCredentials(ctx)
	if err != nil {
		return nil, err
	}
	if creds == nil {
		return grpc.EmptyDialOption{}, nil
	}
	return grpc.WithPerRPCCredentials(creds), nil
}

// PerRPCCredentials are the tokens as gRPC call credentials, for a caller
// that sends them on some calls only (grpc.PerRPCCredentials as a call
// option); with RequireTLS only on a TLS connection. Nil when Disabled.
func (c Config) PerRPCCredentials(ctx context.Context) (credentials.PerRPCCredentials, error) {
	if c.Disabled {
		return nil, nil
	}
	ts, err := c.TokenSource(ctx)
	if err != nil {
		return nil, err
	}
	return server.TokenCredentials(ts, c.RequireTLS), nil
}

// HTTPClient returns base (nil: http.DefaultClient's settings) sending the
// tokens as Authorization: Bearer on every request; with RequireTLS only
// to https URLs (a request to another fails unsent).
func (c Config) HTTPClient(ctx context.Context, base *http.Client) (*http.Client, error) {
	if c.Disabled {
		if base == nil {
			base = &http.Client{}
		}
		return base, nil
	}
	ts, err := c.TokenSource(ctx)
	if err != nil {
		return nil, err
	}
	if base == nil {
		base = &http.Client{}
	}
	out := *base
	var rt http.RoundTripper = &oauth2.Transport{Source: ts, Base: base.Transport}
	if c.RequireTLS {
		rt = httpsOnly{rt}
	}
	out.Transport = rt
	return &out, nil
}

// httpsOnly refuses requests that would carry the token in the clear.
type httpsOnly struct{ next http.RoundTripper }

func (t httpsOnly) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" {
		return nil, fmt.Errorf("clientauth: %s is not https: the token is sent over TLS only (TLS is configured)", r.URL.Redacted())
	}
	return t.next.RoundTrip(r)
}
