package web

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"google.golang.org/grpc/metadata"

	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/services/console/internal/login"
	sessions "github.com/lossless-dev/lossless/services/console/internal/session"
)

// Cookie names. With Secure cookies they carry the __Host- prefix, so the
// browser takes them only from this origin over HTTPS, Path=/, no Domain:
// a sibling subdomain cannot plant or overwrite them. Without Secure (a
// console on loopback over plain HTTP, ADR 0019) the plain names.
const (
	sessionCookie = "console_session"
	csrfCookie    = "console_csrf"
	hostPrefix    = "__Host-"
	csrfField     = "csrf"
)

// session is what one request carries: whether it is logged in, who, and
// the CSRF value its forms must carry.
type session struct {
	id        string // unexported: templates cannot reach it
	LoggedIn  bool
	Principal string
	CSRF      string
}

type sessionKey struct{}

func sessionOf(r *http.Request) session {
	s, _ := r.Context().Value(sessionKey{}).(session)
	return s
}

// IdentityVerifier verifies the identity an identity-aware proxy in front
// of the console asserts on every request (e.g. Google IAP's signed
// x-goog-iap-jwt-assertion header, checked against IAP's keys and the
// backend's audience). It returns the principal (an e-mail address or
// account name, at most 200 characters) or an error when the request
// carries no valid assertion.
type IdentityVerifier interface {
	Verify(r *http.Request) (string, error)
}

// auth implements login, sessions and CSRF.
//
// A session is an opaque random id in an HttpOnly cookie; the principal,
// the credential's digest and the times live in the store (internal/session).
// The console names the session's principal on its calls to the operator
// services (outgoing); how it proves itself to them is the connection's
// business (package app), and no credential of the services' ever reaches a
// browser.
//
// CSRF is the signed double-submit pattern bound to the session: the forms
// of a logged-in session carry the HMAC, under a key only this process
// knows, of the session's id; before login, of a random value in an
// HttpOnly cookie. A cross-site page can neither read the cookies nor
// compute the HMAC; a pair taken from an anonymous page does not pass with
// somebody's session, and login rotates both. SameSite=Strict on the
// cookies is a second line: the browser does not send them on a
// cross-site POST at all.
type auth struct {
	serviceToken string
	digest       [32]byte // of serviceToken; zero when none
	operators    *login.File
	identity     IdentityVerifier
	store        *sessions.Store
	limit        *login.Limiter
	csrfKey      []byte
	readOpen     bool
	secure       bool
	logger       *slog.Logger
}

func newAuth(cfg Config, logger *slog.Logger) (*auth, error) {
	store, err := sessions.New(cfg.Sessions)
	if err != nil {
		return nil, err
	}
	limit, err := login.NewLimiter(cfg.LoginLimit)
	if err != nil {
		return nil, err
	}
	a := &auth{serviceToken: cfg.OperatorToken, operators: cfg.Operators, identity: cfg.Identity, store: store, limit: limit,
		readOpen: cfg.ReadOpen, secure: cfg.SecureCookies, csrfKey: make([]byte, 32), logger: logger}
	if _, err := rand.Read(a.csrfKey); err != nil {
		return nil, err
	}
	if cfg.OperatorToken != "" {
		a.digest = sha256.Sum256([]byte(cfg.OperatorToken))
	}
	return a, nil
}

// armed reports whether anybody can log in: with an operators file, or
// with the shared token.
func (a *auth) armed() bool { return a.operators != nil || a.serviceToken != "" }

func (a *auth) name(base string) string {
	if a.secure {
		return hostPrefix + base
	}
	return base
}

// errBadCredential refuses a login; the page says no more than that.
var errBadCredential = errors.New("bad credential")

// check verifies a login form: the principal it makes, the operator whose
// credential it was ("" for the shared token) and that credential's
// digest. With an identity-aware proxy the principal is its verified
// identity, and in operators-file mode that identity is the operator.
func (a *auth) check(r *http.Request, name, credential string) (principal, op string, digest [32]byte, err error) {
	if a.identity != nil {
		id, err := a.identity.Verify(r)
		if err != nil {
			return "", "", digest, err
		}
		// The operator services take at most MaxOperatorName characters
		// of the operator's name.
		if id == "" || len(id) > operator.MaxOperatorName {
			return "", "", digest, fmt.Errorf("identity-aware proxy: identity of %d bytes: want 1 to %d", len(id), operator.MaxOperatorName)
		}
		name, principal = id, id
	}
	if a.operators != nil {
		ops, err := a.operators.Operators()
		if err != nil {
			return "", "", digest, err
		}
		d, ok := ops.Check(name, credential)
		if !ok || !login.NamePattern.MatchString(name) {
			return "", "", digest, errBadCredential
		}
		if principal == "" {
			principal = name
		}
		return principal, name, d, nil
	}
	got := sha256.Sum256([]byte(credential))
	if a.serviceToken == "" || subtle.ConstantTimeCompare(got[:], a.digest[:]) != 1 {
		return "", "", digest, errBadCredential
	}
	if principal == "" {
		if !login.NamePattern.MatchString(name) {
			return "", "", digest, errBadName
		}
		// Anybody holding the shared token can type any name: the audit
		// row says so (ADR 0019).
		principal = name + " (shared token)"
	}
	return principal, "", got, nil
}

var errBadName = errors.New("bad operator name")

// live reports whether a stored session still stands: its credential is
// still its operator's (the shared token, or the operators file's entry),
// and the identity-aware proxy, when there is one, still asserts its
// principal.
func (a *auth) live(r *http.Request, s sessions.Session) bool {
	var current [32]byte
	if s.Operator != "" {
		if a.operators == nil {
			return false
		}
		ops, err := a.operators.Operators()
		if err != nil {
			a.logger.ErrorContext(r.Context(), "console: operators file", "error", err.Error())
			return false
		}
		d, ok := ops.Current(s.Operator)
		if !ok {
			return false
		}
		current = d
	} else {
		if a.serviceToken == "" || a.operators != nil {
			return false
		}
		current = a.digest
	}
	if subtle.ConstantTimeCompare(current[:], s.Credential[:]) != 1 {
		return false
	}
	if a.identity != nil {
		id, err := a.identity.Verify(r)
		if err != nil || subtle.ConstantTimeCompare([]byte(id), []byte(s.Principal)) != 1 {
			return false
		}
	}
	return true
}

func (a *auth) sign(v string) string {
	m := hmac.New(sha256.New, a.csrfKey)
	m.Write([]byte(v))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (a *auth) cookie(base, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: a.name(base), Value: value, Path: "/", MaxAge: maxAge, HttpOnly: true,
		Secure: a.secure, SameSite: http.SameSiteStrictMode}
}

func newCSRFCookieValue() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// middleware attaches the session, issues the CSRF cookie when missing and
// refuses every POST whose CSRF value does not match (403, before any
// handler runs, so a refused POST changes nothing).
func (a *auth) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var s session
		if c, err := r.Cookie(a.name(sessionCookie)); err == nil {
			if st, ok := a.store.Get(c.Value); ok {
				if a.live(r, st) {
					s = session{id: st.ID, LoggedIn: true, Principal: st.Principal}
				} else {
					a.store.Delete(c.Value)
				}
			}
		}
		if s.LoggedIn {
			s.CSRF = a.sign("session\x00" + s.id)
		} else {
			c, err := r.Cookie(a.name(csrfCookie))
			if err != nil || len(c.Value) < 32 {
				if r.Method == http.MethodPost {
					http.Error(w, "403 forbidden: missing CSRF cookie; reload the page and submit again", http.StatusForbidden)
					return
				}
				v, err := newCSRFCookieValue()
				if err != nil {
					http.Error(w, "500 internal error", http.StatusInternalServerError)
					return
				}
				c = a.cookie(csrfCookie, v, 0)
				http.SetCookie(w, c)
			}
			s.CSRF = a.sign("anonymous\x00" + c.Value)
		}
		if r.Method == http.MethodPost {
			if got := r.PostFormValue(csrfField); !hmac.Equal([]byte(got), []byte(s.CSRF)) {
				http.Error(w, "403 forbidden: CSRF token missing or wrong; reload the page and submit again", http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	})
}

// canRead reports whether the request may see read-only pages.
func (a *auth) canRead(r *http.Request) bool { return a.readOpen || sessionOf(r).LoggedIn }

// outgoing returns ctx naming the session's operator in the
// x-lossless-operator metadata (operator.OperatorHeader), when the session
// is logged in. The operator services' connections turn it into the
// console's credential (package app); a call without it carries none.
func outgoing(ctx context.Context, s session) context.Context {
	if !s.LoggedIn || s.Principal == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, operator.OperatorHeader, s.Principal)
}
