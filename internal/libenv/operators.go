package libenv

import (
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/server"
)

// Environment variables of the operator identities (OperatorIdentities).
const (
	EnvOperators = "AUTH_OPERATORS"
	EnvConsoles  = "AUTH_CONSOLES"
)

// OperatorIdentities are who may call a service's operator services with
// an ID token of the callers' issuer and audience (CallerAuth's), besides
// the break-glass operator token (docs/adr/0025-authorization.md).
type OperatorIdentities struct {
	// Operators (env AUTH_OPERATORS, comma list of subjects or verified
	// emails; default none) act as themselves and are recorded so.
	Operators []string
	// Consoles (env AUTH_CONSOLES, comma list; default none) act for the
	// operator named in the x-lossless-operator metadata, recorded as
	// "console:<console>/<operator>".
	Consoles []string
}

// ReadOperatorIdentities reads AUTH_OPERATORS and AUTH_CONSOLES.
func ReadOperatorIdentities(r *envconfig.Reader) OperatorIdentities {
	return OperatorIdentities{
		Operators: SplitSubjects(r.String(EnvOperators, "")),
		Consoles:  SplitSubjects(r.String(EnvConsoles, "")),
	}
}

// Validate refuses an identity that cannot name a token's caller, and
// identities without caller authentication to verify their tokens.
func (o OperatorIdentities) Validate(auth CallerAuth) error {
	var errs []error
	for _, l := range [...]struct {
		env string
		ids []string
	}{{EnvOperators, o.Operators}, {EnvConsoles, o.Consoles}} {
		for _, id := range l.ids {
			switch {
			case id == "*" || id == server.AnonymousCaller.Subject:
				errs = append(errs, fmt.Errorf("%s: %q names no one identity: list subjects or verified emails", l.env, id))
			case strings.IndexFunc(id, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) >= 0:
				errs = append(errs, fmt.Errorf("%s: %q has a blank or unprintable character", l.env, id))
			}
		}
		if len(l.ids) > 0 && auth.Disabled {
			errs = append(errs, fmt.Errorf("%s: needs caller authentication to verify tokens, but %s=true", l.env, EnvAuthDisabled))
		}
	}
	return errors.Join(errs...)
}

// GuardOptions are the operator guard's options for these identities,
// verified by auth's issuer and audience, and for the process's REST
// gateway mark (nil: none).
func (o OperatorIdentities) GuardOptions(auth CallerAuth, gateway *operator.GatewayMark) ([]operator.GuardOption, error) {
	opts := []operator.GuardOption{operator.WithGatewayMark(gateway)}
	if auth.Disabled || len(o.Operators)+len(o.Consoles) == 0 {
		return opts, nil
	}
	v, err := server.NewOIDCVerifier(auth.OIDC, nil)
	if err != nil {
		return nil, fmt.Errorf("%s / %s: %w", EnvAuthIssuer, EnvAuthAudience, err)
	}
	return append(opts, operator.WithIdentities(operator.Identities{Auth: v, Operators: o.Operators, Consoles: o.Consoles})), nil
}
