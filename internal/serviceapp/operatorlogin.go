package serviceapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/lossless-dev/lossless/internal/clientauth"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/operator"
)

// Environment variables an operator command authenticates with (one of
// them; without any its repairs are refused, its reads work).
const (
	// EnvOperatorIDToken is the operator's ID token for the service's
	// AUTH_AUDIENCE (e.g. `gcloud auth print-identity-token
	// --audiences=...`); EnvOperatorIDTokenFile a file holding one.
	EnvOperatorIDToken     = "OPERATOR_ID_TOKEN"
	EnvOperatorIDTokenFile = "OPERATOR_ID_TOKEN_FILE"
	// EnvOperatorTokenURL, EnvOperatorClientID and EnvOperatorClientSecret
	// get the ID token by the client-credentials grant (the local issuer of
	// `make run`); the operator is the client id. Not AUTH_CLIENT_ID: that
	// is the service's own identity.
	EnvOperatorTokenURL     = "OPERATOR_TOKEN_URL"
	EnvOperatorClientID     = "OPERATOR_CLIENT_ID"
	EnvOperatorClientSecret = "OPERATOR_CLIENT_SECRET"
	// EnvOperatorBreakGlass=true runs the command as operator.BreakGlass:
	// holding DATABASE_URL is the privilege, the ticket must say why.
	EnvOperatorBreakGlass = "OPERATOR_BREAK_GLASS"
)

// operatorLogIn returns ops acting as the operator the environment
// authenticates: an ID token verified as the service verifies its
// operators' (AUTH_ISSUER, AUTH_AUDIENCE, AUTH_OPERATORS), or break-glass.
// With no credential ops is returned as is.
func operatorLogIn(ctx context.Context, env *envconfig.Reader, ops operator.Operations, logger *slog.Logger) (operator.Operations, error) {
	tok := env.String(EnvOperatorIDToken, "")
	if f := env.String(EnvOperatorIDTokenFile, ""); f != "" && tok == "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvOperatorIDTokenFile, err)
		}
		tok = strings.TrimSpace(string(b))
	}
	breakGlass := env.Bool(EnvOperatorBreakGlass, false)
	auth := libenv.ReadCallerAuth(env)
	ids := libenv.ReadOperatorIdentities(env)
	cc := clientauth.Config{TokenURL: env.String(EnvOperatorTokenURL, ""), ClientID: env.String(EnvOperatorClientID, ""),
		ClientSecret: env.String(EnvOperatorClientSecret, ""), Audience: auth.OIDC.Audience, AudienceVar: libenv.EnvAuthAudience}
	if err := env.Err(); err != nil {
		return nil, err
	}
	switch {
	case breakGlass && (tok != "" || cc.TokenURL != ""):
		return nil, fmt.Errorf("%s: set either it or an operator's ID token, not both", EnvOperatorBreakGlass)
	case breakGlass:
		logger.Warn("operator command run as break-glass (" + EnvOperatorBreakGlass + "=true)")
		return operator.ActingAs(ops, operator.BreakGlass)
	case tok == "" && cc.TokenURL != "":
		ts, err := cc.TokenSource(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvOperatorTokenURL, err)
		}
		t, err := ts.Token()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvOperatorTokenURL, err)
		}
		tok = t.AccessToken
	case tok == "":
		return ops, nil
	}
	// The issuer and audience verify the operator; AUTH_CLIENTS, the public
	// API's customers, has no say here.
	if err := errors.Join(auth.ValidateIdentity(), ids.Validate(auth)); err != nil {
		return nil, err
	}
	opts, err := ids.GuardOptions(auth, nil)
	if err != nil {
		return nil, err
	}
	g, err := operator.NewGuard("", "OPERATOR_ID_TOKEN", logger, opts...)
	if err != nil {
		return nil, err
	}
	who, err := g.LogIn(ctx, tok, "")
	if err != nil {
		return nil, fmt.Errorf("operator login (%s): %w", libenv.EnvOperators, err)
	}
	logger.Info("operator command run", "operator", who)
	return operator.ActingAs(ops, who)
}
