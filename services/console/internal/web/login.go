package web

import (
	"errors"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, "login", page{Title: "Log in", Data: h.loginData(safeNext(r.URL.Query().Get("next")))})
}

// loginData is what the login page shows besides the error.
type loginData struct {
	Next string
	// Operators: each operator has their own credential (operators file).
	Operators bool
	// Proxied: the identity-aware proxy names the operator.
	Proxied bool
}

func (h *Handler) loginData(next string) loginData {
	return loginData{Next: next, Operators: h.auth.operators != nil, Proxied: h.auth.identity != nil}
}

// login checks the form's operator and credential, at most
// LoginLimit.Failures failures a window per operator name and per client
// address (behind TrustedProxies, the forwarded one), and starts a session. The
// credential travels in the POST body only and is never written to a page,
// a URL, a cookie or a log line.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostFormValue("next"))
	peer := peerAddr(r)
	client := h.cfg.TrustedProxies.ClientAddr(r)
	log := h.logger.With("peer", peer)
	if client != peer {
		log = log.With("client", client)
	}
	if fwd := r.Header.Get("X-Forwarded-For"); fwd != "" {
		// As the client sent it: only the hops TrustedProxies vouch for
		// count (client above).
		log = log.With("forwarded_for", truncate(fwd, 200))
	}
	name := strings.TrimSpace(r.PostFormValue("operator"))
	// One address guessing many names, and many addresses guessing one
	// name, are both bounded; another operator elsewhere is not.
	keys := []string{"addr " + limitKey(client)}
	if name != "" {
		keys = append(keys, "name "+truncate(name, 100))
	}
	if ok, wait := h.auth.limit.Allow(keys...); !ok {
		log.WarnContext(r.Context(), "console: login refused: too many failures for this operator or from this address", "operator", truncate(name, 100))
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		w.WriteHeader(http.StatusTooManyRequests)
		h.render(w, r, "login", page{Title: "Log in", Error: "Too many failed logins for this operator or from your address: try again later.",
			Data: h.loginData(next)})
		return
	}
	principal, op, digest, err := h.auth.check(r, name, r.PostFormValue("token"))
	if err != nil {
		h.auth.limit.Fail(keys...)
		msg := "That is not the operator's credential."
		switch {
		case !h.auth.armed():
			msg = "Login is disabled: neither CONSOLE_OPERATORS_FILE nor CONSOLE_OPERATOR_TOKEN is set."
		case errors.Is(err, errBadName):
			msg = "Operator: a name such as alice or alice@example.com (letters, digits, . _ @ + -)."
		case !errors.Is(err, errBadCredential):
			msg = "Login is unavailable: " + err.Error()
		}
		log.WarnContext(r.Context(), "console: login refused", "reason", err.Error())
		w.WriteHeader(http.StatusUnauthorized)
		h.render(w, r, "login", page{Title: "Log in", Error: msg, Data: h.loginData(next)})
		return
	}
	if c, err := r.Cookie(h.auth.name(sessionCookie)); err == nil {
		h.auth.store.Delete(c.Value)
	}
	s, err := h.auth.store.Create(principal, op, digest)
	if err != nil {
		http.Error(w, "500 internal error", http.StatusInternalServerError)
		return
	}
	// A new pre-login CSRF value too: nothing issued before login passes after it.
	v, err := newCSRFCookieValue()
	if err != nil {
		http.Error(w, "500 internal error", http.StatusInternalServerError)
		return
	}
	http.SetCookie(w, h.auth.cookie(csrfCookie, v, 0))
	// A browser session cookie (no Max-Age): closing the browser logs out;
	// the store ends it at its lifetime or idle timeout anyway.
	http.SetCookie(w, h.auth.cookie(sessionCookie, s.ID, 0))
	log.InfoContext(r.Context(), "console: operator logged in", "principal", principal)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if s := sessionOf(r); s.LoggedIn {
		h.auth.store.Delete(s.id)
		h.logger.InfoContext(r.Context(), "console: operator logged out", "principal", s.Principal)
	}
	http.SetCookie(w, h.auth.cookie(sessionCookie, "", -1))
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// peerAddr is the address the connection comes from: behind a proxy or
// load balancer, the proxy's.
func peerAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// limitKey is what the failed-login limit counts by: the IPv4 address, or
// the /64 of an IPv6 one (one host commonly holds a whole /64).
func limitKey(peer string) string {
	ip, err := netip.ParseAddr(peer)
	if err != nil {
		return peer
	}
	if ip = ip.Unmap(); ip.Is4() {
		return ip.String()
	}
	p, err := ip.Prefix(64)
	if err != nil {
		return peer
	}
	return p.String()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
