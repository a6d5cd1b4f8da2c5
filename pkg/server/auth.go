package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Caller is the verified identity of a request's sender: the issuer and
// subject of its bearer token, and its email when the issuer verified it
// (Google's ID tokens of a service account carry the account's email; their
// subject is its numeric unique id). Subjects are unique per issuer, and a
// service trusts one issuer, so Subject alone names a caller: it is what a
// service records.
type Caller struct {
	Issuer  string
	Subject string
	Email   string // "" unless the token says email_verified
}

// Is reports whether id names the caller: its subject, or its verified
// email (so an allow-list may name a Google service account by its email).
func (c Caller) Is(id string) bool {
	return id != "" && (id == c.Subject || id == c.Email)
}

type callerKey struct{}

// CallerFrom returns the caller WithCallerAuth verified for ctx's request;
// false when the request did not pass through it (a handler reached without
// authentication must refuse, not guess).
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// ContextWithCaller returns ctx carrying c, as WithCallerAuth does after
// verifying a token. For code that runs a handler in-process on a caller's
// behalf.
func ContextWithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// Authenticator verifies a bearer token and names its caller. An error is
// the token's fault (refused with UNAUTHENTICATED) unless it is a gRPC
// status, which is returned as is (e.g. UNAVAILABLE while the issuer's keys
// cannot be fetched).
type Authenticator interface {
	Authenticate(ctx context.Context, bearerToken string) (Caller, error)
}

// AnonymousCaller is the caller every request is when authentication is
// switched off (AnonymousAuthenticator).
var AnonymousCaller = Caller{Subject: "anonymous"}

// AnonymousAuthenticator accepts every request, with or without a token, as
// AnonymousCaller: one caller with one idempotency scope and one owner for
// every order. For benchmarks of the data path only; never where anyone
// else can reach the API.
type AnonymousAuthenticator struct{}

// Authenticate implements Authenticator.
func (AnonymousAuthenticator) Authenticate(context.Context, string) (Caller, error) {
	return AnonymousCaller, nil
}

// Services WithCallerAuth never authenticates, unary or streaming: gRPC
// health checks (probes and load balancers carry no token) and server
// reflection, which serve no data.
const (
	healthService        = "grpc.health.v1.Health"
	reflectionServiceV1  = "grpc.reflection.v1.ServerReflection"
	reflectionServiceV1a = "grpc.reflection.v1alpha.ServerReflection"
)

// WithCallerAuth requires a bearer token (`authorization: Bearer <token>`;
// the REST gateway forwards the HTTP Authorization header as that metadata)
// on every gRPC and REST call, verified by a, before request validation: a
// call without one, or with one a refuses, is answered UNAUTHENTICATED (HTTP
// 401 with WWW-Authenticate: Bearer) and learns nothing about its request.
// The verified Caller is in the handler's context (CallerFrom).
//
// It fails closed: every method is authenticated except those of the gRPC
// health and reflection services and the unary methods of the services
// named in exempt (full names, "package.Service"), which must guard
// themselves (the operator services do, with the operator token of
// pkg/operator). A method added to a public service later is authenticated
// without anyone remembering to; a streaming method of an exempt service is
// refused UNAUTHENTICATED: the unary interceptors that guard it do not run
// for streams (WithCallerAuthExempting names its stream guard).
//
// An authorization value over MaxAuthorizationBytes is refused before it is
// parsed or verified.
func WithCallerAuth(a Authenticator, exempt ...string) Option {
	services := make([]ExemptService, len(exempt))
	for i, s := range exempt {
		services[i] = ExemptService{Name: s}
	}
	return WithCallerAuthExempting(a, services...)
}

// ExemptService is a service WithCallerAuthExempting does not authenticate.
type ExemptService struct {
	// Name is the service's full name, "package.Service".
	Name string
	// Stream guards its streaming methods; nil: they are refused.
	Stream grpc.StreamServerInterceptor
}

// WithCallerAuthExempting is WithCallerAuth with the exempt services' stream
// guards: a streaming method of an exempt service runs behind its Stream
// interceptor, or is refused without one.
func WithCallerAuthExempting(a Authenticator, exempt ...ExemptService) Option {
	return func(o *options) {
		skip := map[string]bool{healthService: true, reflectionServiceV1: true, reflectionServiceV1a: true}
		builtin := map[string]bool{healthService: true, reflectionServiceV1: true, reflectionServiceV1a: true}
		guards := map[string]grpc.StreamServerInterceptor{}
		for _, s := range exempt {
			skip[s.Name] = true
			if s.Stream != nil {
				guards[s.Name] = s.Stream
			}
		}
		o.callerAuth = &callerAuth{auth: a, exempt: skip, builtin: builtin, streamGuards: guards,
			refusals: newLogThrottle(outageLogInterval)}
	}
}

// MaxAuthorizationBytes bounds the authorization metadata WithCallerAuth
// reads: a longer value is refused UNAUTHENTICATED before it is parsed.
// An ID token is 1 to 2 KiB; the bound leaves room for large claims sets.
const MaxAuthorizationBytes = 8 << 10

type callerAuth struct {
	auth   Authenticator
	exempt map[string]bool
	// builtin are the exempt services whose streams pass too (health,
	// reflection); streamGuards guard the others' streams.
	builtin      map[string]bool
	streamGuards map[string]grpc.StreamServerInterceptor
	log          *slog.Logger
	// refusals spaces the log lines of refused tokens per method: a client
	// with an expired token refused on every call is one line, not a flood.
	refusals *logThrottle
}

// serviceOf returns "package.Service" of "/package.Service/Method".
func serviceOf(fullMethod string) string {
	s := strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[:i]
	}
	return s
}

// authenticate returns ctx with the caller of its request, or the error to
// answer with.
func (c *callerAuth) authenticate(ctx context.Context, fullMethod string) (context.Context, error) {
	if c.exempt[serviceOf(fullMethod)] {
		return ctx, nil
	}
	if _, ok := c.auth.(AnonymousAuthenticator); ok {
		return ContextWithCaller(ctx, AnonymousCaller), nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 || vals[0] == "" {
		return ctx, status.Error(codes.Unauthenticated,
			"missing credentials: send an OIDC ID token as authorization: Bearer <token> (HTTP: Authorization header)")
	}
	if len(vals[0]) > MaxAuthorizationBytes {
		return ctx, status.Errorf(codes.Unauthenticated, "authorization over %d bytes refused", MaxAuthorizationBytes)
	}
	tok, ok := cutBearer(vals[0])
	if !ok {
		return ctx, status.Error(codes.Unauthenticated, "malformed authorization: want Bearer <token>")
	}
	caller, err := c.auth.Authenticate(ctx, tok)
	if err != nil {
		if _, isStatus := status.FromError(err); isStatus {
			return ctx, err
		}
		if ok, skipped := c.refusals.allow(fullMethod, time.Now()); ok {
			c.log.InfoContext(ctx, "bearer token refused", "method", fullMethod, "error", err, "similar_refusals_not_logged", skipped)
		}
		// Why (which issuer or audience was expected) is for the log only.
		return ctx, status.Error(codes.Unauthenticated, "bearer token refused")
	}
	return ContextWithCaller(ctx, caller), nil
}

// cutBearer returns the token of "Bearer <token>" (the scheme is
// case-insensitive, RFC 7235).
func cutBearer(v string) (string, bool) {
	scheme, tok, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

func (c *callerAuth) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := c.authenticate(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// stream guards streaming methods the same way, so a public streaming RPC
// is not an unauthenticated way in; nor is an exempt service's, which
// passes only its own stream guard.
func (c *callerAuth) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if svc := serviceOf(info.FullMethod); c.exempt[svc] && !c.builtin[svc] {
			guard, ok := c.streamGuards[svc]
			if !ok {
				return status.Error(codes.Unauthenticated, "streaming method of an unguarded service refused")
			}
			return guard(srv, ss, info, handler)
		}
		ctx, err := c.authenticate(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &callerStream{ServerStream: ss, ctx: ctx})
	}
}

type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *callerStream) Context() context.Context { return s.ctx }

// OIDCConfig names the tokens an OIDCVerifier accepts.
type OIDCConfig struct {
	// Issuer is the token issuer (its "iss" claim and the base of its
	// discovery document), e.g. https://accounts.google.com. Required.
	Issuer string
	// Audience is the "aud" the tokens must carry: this service's own name
	// for itself (on GCP, the URL its callers mint Google ID tokens for).
	// Required: a token minted for another service must not be accepted here.
	Audience string
	// JWKSURL is where the issuer's signing keys are published. Default "":
	// read from the issuer's discovery document
	// (Issuer/.well-known/openid-configuration) at the first request.
	JWKSURL string
	// AllowHTTP accepts http:// issuer and JWKS URLs on any host. Default
	// false: https only, except on loopback hosts (127.0.0.0/8, ::1,
	// localhost), since keys fetched in the clear can be swapped on the
	// way. For a private development network only (compose, the local
	// overlay).
	AllowHTTP bool
}

// Validate reports missing or malformed settings.
func (c OIDCConfig) Validate() error {
	var errs []error
	if c.Issuer == "" {
		errs = append(errs, errors.New("issuer is empty"))
	} else if err := CheckKeyURL(c.Issuer, c.AllowHTTP); err != nil {
		errs = append(errs, fmt.Errorf("issuer: %w", err))
	}
	if c.Audience == "" {
		errs = append(errs, errors.New("audience is empty: a service must only accept tokens minted for it"))
	}
	if c.JWKSURL != "" {
		if err := CheckKeyURL(c.JWKSURL, c.AllowHTTP); err != nil {
			errs = append(errs, fmt.Errorf("JWKS URL: %w", err))
		}
	}
	return errors.Join(errs...)
}

// CheckKeyURL checks a URL keys are fetched from (an issuer's, a JWKS): an
// https URL, or an http one on a loopback host (or anywhere with
// allowHTTP).
func CheckKeyURL(s string, allowHTTP bool) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", s)
	}
	if u.Scheme == "http" && !allowHTTP && !isLoopbackHost(u.Hostname()) {
		return fmt.Errorf("%q: want https (http only on a loopback host)", s)
	}
	return nil
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// OIDCVerifier verifies OIDC ID tokens (signed JWTs) with the issuer's
// published keys (JWKS), fetched over HTTP and cached; a token signed by an
// unknown key makes it fetch the keys again, so the issuer's key rotation
// needs no restart.
//
// It remembers the caller of each token it verified (verdicts) until the
// token expires or for VerdictTTL, whichever comes first: a client sends
// the same token on every call until it expires, and checking its RSA
// signature again was most of what authentication cost per call (B5's
// profiles). Only tokens that passed every check are remembered, by their
// SHA-256, so a token is accepted from memory only if the very same bytes
// were verified, and never after their expiry (plus ClockLeeway).
//
// The keys are fetched again when a token names an unknown key, at most
// once per KeyRefetchInterval, each fetch within KeyFetchTimeout.
type OIDCVerifier struct {
	cfg    OIDCConfig
	client *http.Client
	now    func() time.Time

	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier

	verdictsMu sync.Mutex
	verdicts   verdicts
}

// ClockLeeway is how far the issuer's clock and ours may disagree: a token
// is accepted until ClockLeeway past its expiry, and refused when issued
// (iat) more than ClockLeeway in the future.
const ClockLeeway = 30 * time.Second

// VerdictTTL bounds how long OIDCVerifier accepts a verified token without
// checking it again, whatever its expiry: a key the issuer withdrew stops
// vouching for tokens remembered under it within this time (go-oidc's key
// set itself keeps a withdrawn key until it meets a token signed by an
// unknown one). maxVerdicts bounds the memory: beyond it, expired verdicts
// are dropped, then arbitrary ones.
const (
	VerdictTTL  = time.Minute
	maxVerdicts = 4096
)

type verdict struct {
	caller Caller
	until  time.Time
}

type verdicts map[[sha256.Size]byte]verdict

// get returns the caller remembered for key if its verdict still holds at now.
func (vs verdicts) get(key [sha256.Size]byte, now time.Time) (Caller, bool) {
	v, ok := vs[key]
	if !ok || !now.Before(v.until) {
		return Caller{}, false
	}
	return v.caller, true
}

func (vs verdicts) put(key [sha256.Size]byte, v verdict, now time.Time) {
	if len(vs) >= maxVerdicts {
		for k, old := range vs {
			if !now.Before(old.until) {
				delete(vs, k)
			}
		}
		for k := range vs {
			if len(vs) < maxVerdicts {
				break
			}
			delete(vs, k)
		}
	}
	vs[key] = v
}

// NewOIDCVerifier returns a verifier for cfg. It does not reach the issuer:
// the keys (and, without JWKSURL, the discovery document) are fetched at
// the first request, so a service may start before its issuer. client
// makes those requests (nil: a client with a 10 s timeout).
func NewOIDCVerifier(cfg OIDCConfig, client *http.Client) (*OIDCVerifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("server: OIDC: %w", err)
	}
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	v := &OIDCVerifier{cfg: cfg, client: client, now: time.Now, verdicts: make(verdicts)}
	if cfg.JWKSURL != "" {
		v.verifier = v.newVerifier(cfg.JWKSURL)
	}
	return v, nil
}

// newVerifier verifies with the keys at jwksURL. go-oidc has no leeway: its
// clock runs ClockLeeway late instead.
func (v *OIDCVerifier) newVerifier(jwksURL string) *oidc.IDTokenVerifier {
	keys := newKeySet(jwksURL, v.client, KeyFetchTimeout, func() time.Time { return v.now() })
	return oidc.NewVerifier(v.cfg.Issuer, keys, &oidc.Config{ClientID: v.cfg.Audience,
		Now: func() time.Time { return v.now().Add(-ClockLeeway) }})
}

// idTokenVerifier returns the verifier, discovering the issuer's keys on
// first use. A failed discovery is retried by the next request.
func (v *OIDCVerifier) idTokenVerifier(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.verifier != nil {
		return v.verifier, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), KeyFetchTimeout)
	defer cancel()
	p, err := oidc.NewProvider(oidc.ClientContext(ctx, v.client), v.cfg.Issuer)
	if err != nil {
		return nil, err
	}
	var meta struct {
		JWKSURL string `json:"jwks_uri"`
	}
	if err := p.Claims(&meta); err != nil || meta.JWKSURL == "" {
		return nil, fmt.Errorf("discovery document of %s has no jwks_uri", v.cfg.Issuer)
	}
	if err := CheckKeyURL(meta.JWKSURL, v.cfg.AllowHTTP); err != nil {
		return nil, fmt.Errorf("discovery document of %s: jwks_uri: %w", v.cfg.Issuer, err)
	}
	v.verifier = v.newVerifier(meta.JWKSURL)
	return v.verifier, nil
}

// Authenticate implements Authenticator: signature, issuer, audience and
// expiry are checked; the caller is the token's subject. A token verified
// before is answered from memory while its verdict holds (see OIDCVerifier).
func (v *OIDCVerifier) Authenticate(ctx context.Context, token string) (Caller, error) {
	key := sha256.Sum256([]byte(token))
	v.verdictsMu.Lock()
	caller, ok := v.verdicts.get(key, v.now())
	v.verdictsMu.Unlock()
	if ok {
		return caller, nil
	}
	caller, expiry, err := v.verify(ctx, token)
	if err != nil {
		return Caller{}, err
	}
	now := v.now()
	until := now.Add(VerdictTTL)
	if exp := expiry.Add(ClockLeeway); exp.Before(until) {
		until = exp
	}
	v.verdictsMu.Lock()
	v.verdicts.put(key, verdict{caller: caller, until: until}, now)
	v.verdictsMu.Unlock()
	return caller, nil
}

// verify checks token with the issuer's keys; it returns its caller and expiry.
func (v *OIDCVerifier) verify(ctx context.Context, token string) (Caller, time.Time, error) {
	verifier, err := v.idTokenVerifier(ctx)
	if err != nil {
		return Caller{}, time.Time{}, status.Error(codes.Unavailable, "cannot verify tokens now: the issuer's keys are unreachable")
	}
	idt, err := verifier.Verify(ctx, token)
	if err != nil {
		var expired *oidc.TokenExpiredError
		if strings.Contains(err.Error(), "fetching keys") {
			return Caller{}, time.Time{}, status.Error(codes.Unavailable, "cannot verify tokens now: the issuer's keys are unreachable")
		}
		if errors.As(err, &expired) {
			return Caller{}, time.Time{}, errors.New("token expired")
		}
		return Caller{}, time.Time{}, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "oidc: "))
	}
	var claims struct {
		Email         string `json:"email"`
		EmailVerified bool   `json:"email_verified"`
	}
	_ = idt.Claims(&claims) // optional claims
	if !claims.EmailVerified {
		claims.Email = ""
	}
	if idt.Subject == "" {
		return Caller{}, time.Time{}, errors.New("token has no subject")
	}
	if idt.IssuedAt.After(v.now().Add(ClockLeeway)) {
		return Caller{}, time.Time{}, fmt.Errorf("token issued in the future (iat %v)", idt.IssuedAt)
	}
	return Caller{Issuer: idt.Issuer, Subject: idt.Subject, Email: claims.Email}, idt.Expiry, nil
}

// TokenCredentials is the client side of WithCallerAuth: gRPC per-RPC
// credentials sending ts's token as "authorization: Bearer <token>" on
// every call (grpc.WithPerRPCCredentials) that does not set its own
// authorization metadata. The token is the AccessToken of
// ts's tokens: give it a source of ID tokens (Google's idtoken package, or
// a client-credentials source whose id_token is taken as the token).
// requireTLS refuses to send the token over a connection without transport
// security: true whenever the process dials with TLS, so a misconfigured
// connection fails rather than sending the token in the clear; false only
// where the process has no TLS (loopback, local runs).
func TokenCredentials(ts oauth2.TokenSource, requireTLS bool) credentials.PerRPCCredentials {
	return tokenCredentials{ts: ts, requireTLS: requireTLS}
}

type tokenCredentials struct {
	ts         oauth2.TokenSource
	requireTLS bool
}

func (c tokenCredentials) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	// A call that carries its own authorization (an operator token for an
	// operator service on the same connection) is sent with it alone.
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get("authorization")) > 0 {
		return nil, nil
	}
	tok, err := c.ts.Token()
	if err != nil {
		// UNAVAILABLE: the call was not sent, retrying later may succeed.
		return nil, status.Errorf(codes.Unavailable, "get a token for the call: %v", err)
	}
	return map[string]string{"authorization": "Bearer " + tok.AccessToken}, nil
}

func (c tokenCredentials) RequireTransportSecurity() bool { return c.requireTLS }
