package web

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"

	"google.golang.org/grpc/metadata"
)

// Cookies. Both HttpOnly and SameSite=Strict; Secure when Config.SecureCookies.
const (
	sessionCookie = "console_session"
	csrfCookie    = "console_csrf"
	csrfField     = "csrf"
)

// session is what one request carries: whether it is logged in, the token
// to forward (empty when not), and the CSRF value its forms must carry.
type session struct {
	token    string // unexported: templates cannot reach it
	LoggedIn bool
	CSRF     string
}

type sessionKey struct{}

func sessionOf(r *http.Request) session {
	s, _ := r.Context().Value(sessionKey{}).(session)
	return s
}

// auth implements login and CSRF.
//
// CSRF is the signed double-submit pattern: a random value in an HttpOnly
// cookie, and in every form the HMAC of that value under a key only this
// process knows. A POST passes when the form's value is the HMAC of the
// cookie's. A cross-site page can neither read the cookie nor compute the
// HMAC, and a cookie planted by a sibling origin does not help it either
// (it cannot sign it). SameSite=Strict on both cookies is a second line:
// the browser does not send them on a cross-site POST at all.
type auth struct {
	digest   [32]byte // of the operator token; zero when none is configured
	armed    bool
	csrfKey  []byte
	readOpen bool
	secure   bool
}

func newAuth(token string, readOpen, secure bool) (*auth, error) {
	a := &auth{readOpen: readOpen, secure: secure, csrfKey: make([]byte, 32)}
	if _, err := rand.Read(a.csrfKey); err != nil {
		return nil, err
	}
	if token != "" {
		a.armed = true
		a.digest = sha256.Sum256([]byte(token))
	}
	return a, nil
}

// valid compares in constant time over digests: neither content nor length
// of the configured token leaks.
func (a *auth) valid(token string) bool {
	got := sha256.Sum256([]byte(token))
	return a.armed && token != "" && subtle.ConstantTimeCompare(got[:], a.digest[:]) == 1
}

func (a *auth) sign(v string) string {
	m := hmac.New(sha256.New, a.csrfKey)
	m.Write([]byte(v))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (a *auth) cookie(name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: maxAge, HttpOnly: true,
		Secure: a.secure, SameSite: http.SameSiteStrictMode}
}

// middleware attaches the session, issues the CSRF cookie when missing and
// refuses every POST whose CSRF value does not match (403, before any
// handler runs, so a refused POST changes nothing).
func (a *auth) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var s session
		if c, err := r.Cookie(sessionCookie); err == nil && a.valid(c.Value) {
			s.token, s.LoggedIn = c.Value, true
		}
		c, err := r.Cookie(csrfCookie)
		if err != nil || len(c.Value) < 32 {
			if r.Method == http.MethodPost {
				http.Error(w, "403 forbidden: missing CSRF cookie; reload the page and submit again", http.StatusForbidden)
				return
			}
			b := make([]byte, 32)
			if _, err := rand.Read(b); err != nil {
				http.Error(w, "500 internal error", http.StatusInternalServerError)
				return
			}
			c = a.cookie(csrfCookie, base64.RawURLEncoding.EncodeToString(b), 0)
			http.SetCookie(w, c)
		}
		s.CSRF = a.sign(c.Value)
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

// outgoing returns ctx carrying the session's token for the services, when
// logged in.
func outgoing(ctx context.Context, s session) context.Context {
	if !s.LoggedIn {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+s.token)
}
