// Package localissuer is a minimal OpenID Connect issuer for local runs
// (`make run`, compose, the stack and end-to-end tests): it publishes the
// discovery document and its signing keys (JWKS) over HTTP, as a real
// issuer does, and mints RS256-signed ID tokens to registered clients by
// the OAuth 2.0 client-credentials grant (RFC 6749 section 4.4), with the
// audience the client asks for, if that audience is one the client is
// registered for (else invalid_target, RFC 8707). The subject of a token is
// the client id.
//
// The services verify its tokens exactly as Google's (pkg/server's
// OIDCVerifier: discovery, JWKS, signature, issuer, audience, expiry), so
// the code path tested locally is the production one; only the issuer
// differs. It is not an identity provider: no users, no consent, one key
// made at start, kept in memory.
package localissuer

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Paths served under the issuer URL.
const (
	DiscoveryPath = "/.well-known/openid-configuration"
	JWKSPath      = "/jwks"
	TokenPath     = "/token"
)

// DefaultTTL is the lifetime of a minted token: an hour, as Google's.
const DefaultTTL = time.Hour

// Issuer signs tokens for its registered clients.
type Issuer struct {
	url     string
	key     *rsa.PrivateKey
	keyID   string
	signer  jose.Signer
	ttl     time.Duration
	now     func() time.Time
	mu      sync.RWMutex
	clients map[string]Client // by id
}

// Client is a registered client: its secret and the audiences (the called
// services' AUTH_AUDIENCE) it may get tokens for. A client without
// audiences gets none.
type Client struct {
	Secret    string
	Audiences []string
}

// New returns an issuer whose tokens say iss = url (the URL it is served
// at, without a trailing slash), for the clients (by id).
func New(url string, clients map[string]Client) (*Issuer, error) {
	url = strings.TrimSuffix(url, "/")
	if url == "" {
		return nil, errors.New("localissuer: empty issuer URL")
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("localissuer: key: %w", err)
	}
	kid := fmt.Sprintf("local-%d", time.Now().UnixNano())
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return nil, fmt.Errorf("localissuer: signer: %w", err)
	}
	is := &Issuer{url: url, key: key, keyID: kid, signer: signer, ttl: DefaultTTL, now: time.Now, clients: map[string]Client{}}
	for id, c := range clients {
		if err := is.Register(id, c); err != nil {
			return nil, err
		}
	}
	return is, nil
}

// URL is the issuer URL (the tokens' iss).
func (is *Issuer) URL() string { return is.url }

// TokenURL is the client-credentials endpoint.
func (is *Issuer) TokenURL() string { return is.url + TokenPath }

// Register adds (or replaces) a client.
func (is *Issuer) Register(id string, c Client) error {
	if id == "" || c.Secret == "" {
		return errors.New("localissuer: a client needs an id and a secret")
	}
	for _, aud := range c.Audiences {
		if aud == "" {
			return fmt.Errorf("localissuer: client %s: empty audience", id)
		}
	}
	c.Audiences = slices.Clone(c.Audiences)
	is.mu.Lock()
	defer is.mu.Unlock()
	is.clients[id] = c
	return nil
}

// Claims of a minted token beyond the registered ones.
type Claims struct {
	Subject  string
	Audience string
	// TTL overrides the issuer's token lifetime; negative mints an expired
	// token (for tests).
	TTL time.Duration
}

// Mint signs an ID token for c, registered client or not: for tests and
// for the process that runs the issuer.
func (is *Issuer) Mint(c Claims) (string, error) {
	if c.Subject == "" || c.Audience == "" {
		return "", errors.New("localissuer: a token needs a subject and an audience")
	}
	ttl := c.TTL
	if ttl == 0 {
		ttl = is.ttl
	}
	now := is.now()
	claims := jwt.Claims{
		Issuer:   is.url,
		Subject:  c.Subject,
		Audience: jwt.Audience{c.Audience},
		IssuedAt: jwt.NewNumericDate(now),
		Expiry:   jwt.NewNumericDate(now.Add(ttl)),
	}
	if ttl < 0 {
		claims.IssuedAt = jwt.NewNumericDate(now.Add(2 * ttl))
	}
	return jwt.Signed(is.signer).Claims(claims).Serialize()
}

// Handler serves discovery, the JWKS and the token endpoint.
func (is *Issuer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+DiscoveryPath, is.serveDiscovery)
	mux.HandleFunc("GET "+JWKSPath, is.serveJWKS)
	mux.HandleFunc("POST "+TokenPath, is.serveToken)
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (is *Issuer) serveDiscovery(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"issuer":                                is.url,
		"jwks_uri":                              is.url + JWKSPath,
		"token_endpoint":                        is.url + TokenPath,
		"grant_types_supported":                 []string{"client_credentials"},
		"token_endpoint_auth_methods_supported": []string{"client_secret_basic", "client_secret_post"},
		"id_token_signing_alg_values_supported": []string{"RS256"},
		"subject_types_supported":               []string{"public"},
		"response_types_supported":              []string{"id_token"},
	})
}

func (is *Issuer) serveJWKS(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: &is.key.PublicKey, KeyID: is.keyID, Algorithm: string(jose.RS256), Use: "sig"},
	}})
}

// tokenError answers as RFC 6749 section 5.2 says.
func tokenError(w http.ResponseWriter, code int, kind, desc string) {
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Basic realm="localissuer"`)
	}
	writeJSON(w, code, map[string]string{"error": kind, "error_description": desc})
}

// serveToken is the client-credentials grant. The client authenticates with
// HTTP Basic or client_id/client_secret form fields; "audience" names the
// service the token is for. The ID token is returned both as access_token
// and id_token: the services take ID tokens as bearer tokens.
func (is *Issuer) serveToken(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		tokenError(w, http.StatusBadRequest, "invalid_request", "malformed form body")
		return
	}
	if gt := r.PostForm.Get("grant_type"); gt != "client_credentials" {
		tokenError(w, http.StatusBadRequest, "unsupported_grant_type", "only client_credentials is supported")
		return
	}
	id, secret, ok := r.BasicAuth()
	if !ok {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	is.mu.RLock()
	c, known := is.clients[id]
	is.mu.RUnlock()
	if !known || subtle.ConstantTimeCompare([]byte(secret), []byte(c.Secret)) != 1 {
		tokenError(w, http.StatusUnauthorized, "invalid_client", "unknown client or wrong secret")
		return
	}
	aud := r.PostForm.Get("audience")
	if aud == "" {
		tokenError(w, http.StatusBadRequest, "invalid_request", "audience is required: the service the token is for")
		return
	}
	if !slices.Contains(c.Audiences, aud) {
		tokenError(w, http.StatusBadRequest, "invalid_target",
			fmt.Sprintf("client %s may not get tokens for audience %q", id, aud))
		return
	}
	tok, err := is.Mint(Claims{Subject: id, Audience: aud})
	if err != nil {
		tokenError(w, http.StatusInternalServerError, "server_error", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"access_token": tok, "id_token": tok, "token_type": "Bearer", "expires_in": int(is.ttl.Seconds()),
	})
}

// ParseClients parses "id:secret:aud|aud,id:secret:aud" (the
// LOCALISSUER_CLIENTS format): each client with the audiences it may get
// tokens for, at least one. An audience may contain ':' (a URL); ',' and
// '|' separate.
func ParseClients(s string) (map[string]Client, error) {
	out := map[string]Client{}
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		id, rest, ok1 := strings.Cut(entry, ":")
		secret, auds, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || id == "" || secret == "" || auds == "" {
			return nil, fmt.Errorf("client %q: want id:secret:audience[|audience...]", entry)
		}
		c := Client{Secret: secret}
		for _, aud := range strings.Split(auds, "|") {
			if aud = strings.TrimSpace(aud); aud == "" {
				return nil, fmt.Errorf("client %s: empty audience", id)
			}
			c.Audiences = append(c.Audiences, aud)
		}
		out[id] = c
	}
	if len(out) == 0 {
		return nil, errors.New("no clients: want id:secret:audience[|audience...][,...]")
	}
	return out, nil
}

// FormatClients is the inverse of ParseClients, in id order.
func FormatClients(clients map[string]Client) string {
	ids := make([]string, 0, len(clients))
	for id := range clients {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	parts := make([]string, 0, len(ids))
	for _, id := range ids {
		c := clients[id]
		parts = append(parts, id+":"+c.Secret+":"+strings.Join(c.Audiences, "|"))
	}
	return strings.Join(parts, ",")
}
