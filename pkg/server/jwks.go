package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
)

// Bounds of the issuer's key fetches. go-oidc's RemoteKeySet fetches the
// key set again whenever no cached key verifies a token, so anyone could
// make every request cost a fetch from the issuer by sending a token with
// an unknown key id (or a bad signature).
const (
	// KeyRefetchInterval is the least time between two fetches of the key
	// set: a token signed by a key the issuer published since is refused
	// for at most this long after the previous fetch.
	KeyRefetchInterval = 30 * time.Second
	// keyRetryInterval is the least time between fetches while there are
	// no keys at all (the issuer unreachable at start): answered
	// UNAVAILABLE meanwhile.
	keyRetryInterval = 2 * time.Second
	// KeyFetchTimeout bounds each fetch of the key set or the discovery
	// document, whatever the HTTP client's own timeout.
	KeyFetchTimeout = 10 * time.Second
	// maxKeySetBytes bounds the key set read; Google's is about 2 KiB.
	maxKeySetBytes = 1 << 20
)

// signingAlgs are the algorithms a key set accepts; the verifier narrows
// them to the issuer's (go-oidc checks the token's alg first).
var signingAlgs = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.ES256, jose.ES384, jose.ES512,
	jose.PS256, jose.PS384, jose.PS512, jose.EdDSA,
}

// keySet is an oidc.KeySet fetching the issuer's JWKS over HTTP, at most
// once per KeyRefetchInterval whatever the tokens ask for.
type keySet struct {
	url     string
	client  *http.Client
	timeout time.Duration
	now     func() time.Time

	fetchMu sync.Mutex // one fetch at a time; waiters then reuse its result

	mu        sync.Mutex
	keys      []jose.JSONWebKey
	fetchedAt time.Time // last fetch attempt; zero before the first
	fetches   int       // attempts so far (waiters tell a fresh fetch by it)
	lastErr   error     // of the last attempt
}

func newKeySet(url string, client *http.Client, timeout time.Duration, now func() time.Time) *keySet {
	return &keySet{url: url, client: client, timeout: timeout, now: now}
}

// NewKeySet returns a go-oidc key set of the JWKS at url, fetched with
// client (nil: http.DefaultClient) within timeout (0: KeyFetchTimeout),
// and again for a token of an unknown key at most once per
// KeyRefetchInterval (go-oidc's RemoteKeySet fetches for every such token,
// with no timeout of its own).
func NewKeySet(url string, client *http.Client, timeout time.Duration) oidc.KeySet {
	if client == nil {
		client = http.DefaultClient
	}
	if timeout <= 0 {
		timeout = KeyFetchTimeout
	}
	return newKeySet(url, client, timeout, time.Now)
}

// VerifySignature implements oidc.KeySet.
func (k *keySet) VerifySignature(ctx context.Context, jwt string) ([]byte, error) {
	jws, err := jose.ParseSignedCompact(jwt, signingAlgs) // a JWT is compact serialization
	if err != nil {
		return nil, fmt.Errorf("malformed jwt: %w", err)
	}
	if len(jws.Signatures) != 1 {
		return nil, errors.New("want one signature")
	}
	kid := jws.Signatures[0].Header.KeyID
	k.mu.Lock()
	keys, seen := k.keys, k.fetches
	k.mu.Unlock()
	if payload, ok := verifyWith(jws, kid, keys); ok {
		return payload, nil
	}
	keys, fetchErr := k.refetch(ctx, seen)
	if payload, ok := verifyWith(jws, kid, keys); ok {
		return payload, nil
	}
	if fetchErr != nil && !hasKey(keys, kid) {
		// A key we do not hold while the issuer is out of reach: perhaps
		// one it rotated in, so not the caller's fault (UNAVAILABLE).
		return nil, fetchErr
	}
	return nil, errors.New("failed to verify id token signature")
}

// hasKey reports whether keys hold kid (any key, for a token without one).
func hasKey(keys []jose.JSONWebKey, kid string) bool {
	for _, key := range keys {
		if kid == "" || key.KeyID == kid {
			return true
		}
	}
	return false
}

func verifyWith(jws *jose.JSONWebSignature, kid string, keys []jose.JSONWebKey) ([]byte, bool) {
	for _, key := range keys {
		if kid == "" || key.KeyID == kid {
			if payload, err := jws.Verify(&key); err == nil {
				return payload, true
			}
		}
	}
	return nil, false
}

// refetch returns the keys after a fetch, unless one started after the
// caller read the keys (seen), or the last one is too recent: then the
// keys as they are. When that fetch failed, the keys held so far come with
// an error saying "fetching keys", which the verifier answers UNAVAILABLE
// if they cannot verify the token.
func (k *keySet) refetch(ctx context.Context, seen int) ([]jose.JSONWebKey, error) {
	k.fetchMu.Lock()
	defer k.fetchMu.Unlock()
	k.mu.Lock()
	keys, fetches, at, lastErr := k.keys, k.fetches, k.fetchedAt, k.lastErr
	k.mu.Unlock()
	wait := KeyRefetchInterval
	if len(keys) == 0 {
		wait = keyRetryInterval
	}
	if fetches != seen || (fetches > 0 && k.now().Sub(at) < wait) {
		if lastErr != nil {
			return keys, fmt.Errorf("fetching keys: %w", lastErr)
		}
		return keys, nil
	}
	fetched, err := k.fetch(context.WithoutCancel(ctx))
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fetches++
	k.fetchedAt = k.now()
	k.lastErr = err
	if err != nil {
		// The issuer's hiccup: keep the keys we have.
		return k.keys, fmt.Errorf("fetching keys: %w", err)
	}
	k.keys = fetched
	return fetched, nil
}

// fetch reads the key set, within k.timeout; ctx is the request's
// without its cancellation, so one impatient caller does not fail a fetch
// others wait for.
func (k *keySet) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d", k.url, resp.StatusCode)
	}
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxKeySetBytes)).Decode(&set); err != nil {
		return nil, fmt.Errorf("%s: %w", k.url, err)
	}
	return set.Keys, nil
}
