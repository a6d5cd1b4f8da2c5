// Operator identities: who an ID token names, and whom the guard records.

package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"

	"github.com/lossless-dev/lossless/pkg/server"
)

// BreakGlass is the principal of a call with the shared operator token: it
// names no person, so the ticket must.
const BreakGlass = "break-glass"

// OperatorHeader is the metadata a console sends with its own ID token:
// the name of the operator logged in to it, recorded as
// "console:<console>/<name>".
const OperatorHeader = "x-lossless-operator"

// MaxOperatorName bounds OperatorHeader's value, in characters: a console's
// login name (100 characters) with its " (shared token)" mark, or an
// identity-aware proxy's e-mail. The recorded principal must also fit the
// audit's MaxAuditLength.
const MaxOperatorName = 120

// Identities are the ID-token holders a guard admits (WithIdentities).
// Identities are subjects or verified emails (server.Caller.Is).
type Identities struct {
	// Auth verifies the ID tokens: the service's caller authenticator
	// (issuer and audience of AUTH_ISSUER / AUTH_AUDIENCE). Nil, or
	// server.AnonymousAuthenticator, admits no ID token.
	Auth server.Authenticator
	// Operators act as themselves (AUTH_OPERATORS).
	Operators []string
	// Consoles act for the operator named by OperatorHeader
	// (AUTH_CONSOLES).
	Consoles []string
}

func (ids Identities) enabled() bool {
	if ids.Auth == nil || len(ids.Operators)+len(ids.Consoles) == 0 {
		return false
	}
	_, anonymous := ids.Auth.(server.AnonymousAuthenticator)
	return !anonymous
}

func (ids Identities) validate() error {
	for _, id := range slices.Concat(ids.Operators, ids.Consoles) {
		if id == "" || id == server.AnonymousCaller.Subject {
			return fmt.Errorf("operator: identity %q cannot be an operator or a console", id)
		}
	}
	return nil
}

// principal verifies token and names who acts: the operator, or
// "console:<console>/<operator>" for a console with the operator header.
// A console without the header, or an operator with it, is refused: the
// header is the console's word, which only a console may give.
func (ids Identities) principal(ctx context.Context, token string, header []string) (string, error) {
	c, err := ids.Auth.Authenticate(ctx, token)
	if err != nil {
		return "", err
	}
	id := c.Subject
	if c.Email != "" {
		id = c.Email
	}
	isConsole := slices.ContainsFunc(ids.Consoles, c.Is)
	isOperator := slices.ContainsFunc(ids.Operators, c.Is)
	switch {
	case len(header) > 0 && isConsole:
		name, err := operatorName(header)
		if err != nil {
			return "", err
		}
		p := "console:" + id + "/" + name
		if n := utf8.RuneCountInString(p); n > MaxAuditLength {
			return "", fmt.Errorf("console %s acting for %s: the principal has %d characters, the audit at most %d", id, name, n, MaxAuditLength)
		}
		return p, nil
	case len(header) > 0 && isOperator:
		return "", fmt.Errorf("%s is an operator, not a console: it may not send %s", id, OperatorHeader)
	case isOperator:
		return id, nil
	case isConsole:
		return "", fmt.Errorf("console %s must name its operator in %s", id, OperatorHeader)
	}
	return "", fmt.Errorf("%s is neither an operator nor a console", id)
}

// operatorName is the one value of the operator header: non-empty,
// printable, at most MaxOperatorName characters.
func operatorName(vals []string) (string, error) {
	if len(vals) != 1 {
		return "", errors.New(OperatorHeader + " must be sent once")
	}
	v := vals[0]
	switch {
	case v == "":
		return "", errors.New(OperatorHeader + " is empty")
	case !utf8.ValidString(v):
		return "", errors.New(OperatorHeader + " is not UTF-8")
	case utf8.RuneCountInString(v) > MaxOperatorName:
		return "", fmt.Errorf("%s is longer than %d characters", OperatorHeader, MaxOperatorName)
	}
	for _, r := range v {
		if !unicode.IsPrint(r) {
			return "", errors.New(OperatorHeader + " has a character that is not printable")
		}
	}
	return v, nil
}

type principalKey struct{}

func withPrincipal(ctx context.Context, p string) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom is the operator a Guard verified for ctx's call (BreakGlass,
// an identity, or "console:<console>/<operator>"); false when no guard
// did. Only this package sets it, so no request can.
func PrincipalFrom(ctx context.Context) (string, bool) {
	p, ok := ctx.Value(principalKey{}).(string)
	return p, ok && p != ""
}

// WithIdentities makes the guard admit the ID tokens of ids besides the
// break-glass token.
func WithIdentities(ids Identities) GuardOption {
	return func(o *guardOptions) { o.ids = ids }
}
