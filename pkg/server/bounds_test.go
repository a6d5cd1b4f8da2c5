package server_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// countingAuth refuses every token and counts the tokens it was given.
type countingAuth struct{ calls atomic.Int32 }

func (a *countingAuth) Authenticate(context.Context, string) (server.Caller, error) {
	a.calls.Add(1)
	return server.Caller{}, errors.New("refused")
}

func dialInsecure(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// An authorization value over MaxAuthorizationBytes is refused
// UNAUTHENTICATED (HTTP 401) and never reaches the authenticator; one at
// the bound does.
func TestOversizeAuthorizationIsRefusedBeforeVerification(t *testing.T) {
	t.Parallel()
	auth := &countingAuth{}
	b := setup(t, server.WithCallerAuth(auth))
	client := testpb.NewOrderServiceClient(dialInsecure(t, b.srv.GRPCAddr()))
	bearer := func(n int) string { return "Bearer " + strings.Repeat("a", n-len("Bearer ")) }

	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", bearer(server.MaxAuthorizationBytes+1))
	if _, err := client.PutOrder(ctx, validOrder()); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("oversize token: %v, want UNAUTHENTICATED", err)
	}
	req := mustRequest(t, http.MethodPut, b.base+"/v1/orders", validOrderJSON)
	req.Header.Set("Authorization", bearer(server.MaxAuthorizationBytes+1))
	if res, _ := doHTTP(t, req); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("oversize token over REST: HTTP %d, want 401", res.StatusCode)
	}
	if n := auth.calls.Load(); n != 0 {
		t.Fatalf("oversize tokens reached the authenticator %d times", n)
	}
	ctx = metadata.AppendToOutgoingContext(context.Background(), "authorization", bearer(server.MaxAuthorizationBytes))
	if _, err := client.PutOrder(ctx, validOrder()); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("token at the bound: %v, want UNAUTHENTICATED (refused by the authenticator)", err)
	}
	if n := auth.calls.Load(); n != 1 {
		t.Fatalf("token at the bound reached the authenticator %d times, want 1", n)
	}
}

// A call whose metadata exceeds the header-list limit is refused by the
// transport: it reaches no handler. One under the limit passes.
func TestGRPCHeaderListOverTheLimitIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := testpb.NewOrderServiceClient(dialInsecure(t, b.srv.GRPCAddr()))
	pad := func(n int) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "x-pad", strings.Repeat("p", n))
	}
	if _, err := client.PutOrder(pad(server.DefaultMaxHeaderListBytes+1024), validOrder()); err == nil {
		t.Fatal("a header list over the limit was served")
	}
	if n := b.fake.calls.Load(); n != 0 {
		t.Fatalf("the oversize call reached the handler (%d calls)", n)
	}
	if _, err := client.PutOrder(pad(server.DefaultMaxHeaderListBytes/2), validOrder()); err != nil {
		t.Fatalf("a header list under the limit: %v", err)
	}
}

// Calls beyond MaxConcurrentStreams on one connection wait: they do not
// reach the server while the others are in flight.
func TestGRPCConcurrentStreamsPerConnectionAreBounded(t *testing.T) {
	t.Parallel()
	var inside atomic.Int32
	release := make(chan struct{})
	hold := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		inside.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return h(ctx, req)
	}
	b := setupWith(t, server.Config{GRPC: server.GRPCLimits{MaxConcurrentStreams: 2}}, server.WithUnaryInterceptors(hold))
	client := testpb.NewOrderServiceClient(dialInsecure(t, b.srv.GRPCAddr()))
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := client.PutOrder(context.Background(), validOrder())
			errs <- err
		}()
	}
	waitfor.Condition(t, 10*time.Second, "two calls in flight", func() bool { return inside.Load() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := client.PutOrder(ctx, validOrder()); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("third call on the connection: %v, want it to wait until its deadline", err)
	}
	if n := inside.Load(); n != 2 {
		t.Errorf("%d calls reached the server, want 2", n)
	}
	close(release)
	wg.Wait()
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("held call: %v", err)
		}
	}
}

func TestGRPCLimitsValidate(t *testing.T) {
	t.Parallel()
	for _, l := range []server.GRPCLimits{{MaxHeaderListBytes: 1024}, {MaxHeaderListBytes: 32 << 20}, {MaxConcurrentStreams: -1}} {
		if err := (server.Config{GRPCAddr: ":0", HTTPAddr: ":0", GRPC: l}).Validate(); err == nil || !strings.Contains(err.Error(), "gRPC max") {
			t.Errorf("%+v: Validate = %v, want the limit named", l, err)
		}
	}
	if err := (server.GRPCLimits{}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	if d := (server.GRPCLimits{}).WithDefaults(); d.MaxHeaderListBytes != 64<<10 || d.MaxConcurrentStreams != 256 {
		t.Errorf("defaults %+v, want 64 KiB and 256", d)
	}
}

// streamer is a hand-written service with one bidirectional method.
const streamerService = "lossless.pkgtest.v1.Streamer"

func registerStreamer(s *grpc.Server, reached *atomic.Int32) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: streamerService,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Echo", ServerStreams: true, ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				reached.Add(1)
				var m healthpb.HealthCheckRequest
				if err := ss.RecvMsg(&m); err != nil {
					return err
				}
				return ss.SendMsg(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
			}}},
	}, struct{}{})
}

func streamServer(t *testing.T, reached *atomic.Int32, opt server.Option) string {
	t.Helper()
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second},
		slog.New(slog.DiscardHandler), opt)
	if err != nil {
		t.Fatal(err)
	}
	registerStreamer(srv.GRPC(), reached)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return srv.GRPCAddr()
}

func echo(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/"+streamerService+"/Echo")
	if err != nil {
		return err
	}
	// io.EOF when the server ended the stream: RecvMsg has its status.
	_ = st.SendMsg(&healthpb.HealthCheckRequest{})
	var resp healthpb.HealthCheckResponse
	return st.RecvMsg(&resp)
}

// An exempt service's streaming method is no way around authentication:
// refused without a stream guard, served behind its guard with one.
func TestExemptServiceStreamsNeedTheirOwnGuard(t *testing.T) {
	t.Parallel()
	var reached atomic.Int32
	unguarded := streamServer(t, &reached, server.WithCallerAuth(&countingAuth{}, streamerService))
	if err := echo(dialInsecure(t, unguarded)); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("stream of an exempt service without a guard: %v, want UNAUTHENTICATED", err)
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("the unguarded stream reached its handler %d times", n)
	}

	var guarded atomic.Int32
	guard := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		guarded.Add(1)
		return h(srv, ss)
	}
	withGuard := streamServer(t, &reached, server.WithCallerAuthExempting(&countingAuth{},
		server.ExemptService{Name: streamerService, Stream: guard}))
	if err := echo(dialInsecure(t, withGuard)); err != nil {
		t.Fatalf("stream behind its guard: %v", err)
	}
	if guarded.Load() != 1 || reached.Load() != 1 {
		t.Fatalf("guard ran %d times, handler %d; want 1, 1", guarded.Load(), reached.Load())
	}

	// A service that is not exempt: its streams are authenticated.
	authenticated := streamServer(t, &reached, server.WithCallerAuth(&countingAuth{}))
	if err := echo(dialInsecure(t, authenticated)); status.Code(err) != codes.Unauthenticated || reached.Load() != 1 {
		t.Fatalf("stream of a public service without a token: %v (handler reached %d times), want UNAUTHENTICATED", err, reached.Load())
	}
}

// A refusal tells the client no more than "bearer token refused": the
// expected issuer and audience are in the log only.
func TestRefusalsDoNotEchoTheExpectedIssuerOrAudience(t *testing.T) {
	t.Parallel()
	iss := newTestIssuer(t)
	v, err := server.NewOIDCVerifier(server.OIDCConfig{Issuer: iss.url, Audience: "orders-audience"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, server.WithCallerAuth(v))
	client := testpb.NewOrderServiceClient(dialInsecure(t, b.srv.GRPCAddr()))
	hour := time.Now().Add(time.Hour)
	for name, tok := range map[string]string{
		"wrong audience": mint(t, iss.signer, iss.url, "alice", "billing", hour),
		"wrong issuer":   mint(t, iss.signer, "https://elsewhere.example", "alice", "orders-audience", hour),
	} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
		_, err := client.PutOrder(ctx, validOrder())
		st := status.Convert(err)
		if st.Code() != codes.Unauthenticated || st.Message() != "bearer token refused" {
			t.Errorf("%s: %v, want UNAUTHENTICATED \"bearer token refused\"", name, err)
		}
		req := mustRequest(t, http.MethodPut, b.base+"/v1/orders", validOrderJSON)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, body := doHTTP(t, req)
		if res.StatusCode != http.StatusUnauthorized || strings.Contains(string(body), "orders-audience") || strings.Contains(string(body), iss.url) {
			t.Errorf("%s: HTTP %d %s, want 401 naming neither audience nor issuer", name, res.StatusCode, body)
		}
	}
	waitfor.Condition(t, 5*time.Second, "refusal logged with its reason", func() bool {
		// One line per method and interval: the first refusal's reason.
		l := b.logs.String()
		return strings.Contains(l, "bearer token refused") && (strings.Contains(l, "orders-audience") || strings.Contains(l, iss.url))
	})
}

// jwksIssuer serves a JWKS whose keys the test sets, counting fetches.
type jwksIssuer struct {
	url     string
	fetches atomic.Int32
	mu      sync.Mutex
	keys    []jose.JSONWebKey
	down    bool // answer 503: the issuer out of reach
}

func newJWKSIssuer(t *testing.T) *jwksIssuer {
	t.Helper()
	j := &jwksIssuer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		j.fetches.Add(1)
		j.mu.Lock()
		defer j.mu.Unlock()
		if j.down {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: j.keys})
	}))
	t.Cleanup(srv.Close)
	j.url = srv.URL
	return j
}

func (j *jwksIssuer) publish(key *rsa.PrivateKey, kid string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.keys = append(j.keys, jose.JSONWebKey{Key: &key.PublicKey, KeyID: kid, Algorithm: "RS256", Use: "sig"})
}

// verifier is a verifier of j's keys on a clock the test advances, and a
// minter of tokens for it, a new subject each time (none is answered from
// the verdicts), valid for an hour.
func (j *jwksIssuer) verifier(t *testing.T) (v *server.OIDCVerifier, advance func(time.Duration), tokenBy func(*rsa.PrivateKey, string) string) {
	t.Helper()
	v, err := server.NewOIDCVerifier(server.OIDCConfig{Issuer: j.url, Audience: "orders", JWKSURL: j.url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now()
	server.SetClock(v, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	exp := now.Add(time.Hour)
	sub := 0
	return v, func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() },
		func(key *rsa.PrivateKey, kid string) string {
			sub++
			return mint(t, newSigner(t, key, kid), j.url, "alice-"+strconv.Itoa(sub), "orders", exp)
		}
}

func rsaKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Tokens naming unknown keys, or with bad signatures, make the verifier
// fetch the key set at most once per KeyRefetchInterval; a key the issuer
// rotated in is found at the next allowed fetch.
func TestUnknownKeysRefetchTheKeySetAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	j := newJWKSIssuer(t)
	k1, k2, stranger := rsaKey(t), rsaKey(t), rsaKey(t)
	j.publish(k1, "k1")
	v, advance, tokenBy := j.verifier(t)
	ctx := context.Background()

	if _, err := v.Authenticate(ctx, tokenBy(k1, "k1")); err != nil {
		t.Fatalf("valid token: %v", err)
	}
	if n := j.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches after the first token, want 1", n)
	}
	advance(server.KeyRefetchInterval) // the next unknown key may fetch once
	for range 20 {
		if _, err := v.Authenticate(ctx, tokenBy(stranger, "unknown")); err == nil {
			t.Fatal("a token of an unknown key was accepted")
		}
		if _, err := v.Authenticate(ctx, tokenBy(stranger, "k1")); err == nil {
			t.Fatal("a token with a bad signature was accepted")
		}
	}
	if n := j.fetches.Load(); n != 2 {
		t.Fatalf("%d fetches after 40 tokens of unknown keys, want 2", n)
	}

	j.publish(k2, "k2") // the issuer rotates a key in
	advance(server.KeyRefetchInterval / 2)
	if _, err := v.Authenticate(ctx, tokenBy(k2, "k2")); err == nil || j.fetches.Load() != 2 {
		t.Fatalf("new key within the interval: %v, %d fetches; want refused without a fetch", err, j.fetches.Load())
	}
	advance(server.KeyRefetchInterval / 2)
	if c, err := v.Authenticate(ctx, tokenBy(k2, "k2")); err != nil || !strings.HasPrefix(c.Subject, "alice") || j.fetches.Load() != 3 {
		t.Fatalf("new key after the interval: %+v, %v, %d fetches; want accepted after a third fetch", c, err, j.fetches.Load())
	}
}

// While the issuer is out of reach, a token of a key the verifier does not
// hold (perhaps one the issuer rotated in) is UNAVAILABLE, the caller's to
// retry, not UNAUTHENTICATED; a token the held keys refute stays refused as
// such, and the held keys keep verifying.
func TestUnknownKeyWhileTheIssuerIsDownIsUnavailable(t *testing.T) {
	t.Parallel()
	j := newJWKSIssuer(t)
	k1, k2 := rsaKey(t), rsaKey(t)
	j.publish(k1, "k1")
	v, advance, tokenBy := j.verifier(t)
	ctx := context.Background()
	if _, err := v.Authenticate(ctx, tokenBy(k1, "k1")); err != nil {
		t.Fatalf("valid token: %v", err)
	}
	j.mu.Lock()
	j.down = true
	j.mu.Unlock()
	advance(server.KeyRefetchInterval)
	for range 2 { // the failed fetch, then the throttled window after it
		if _, err := v.Authenticate(ctx, tokenBy(k2, "k2")); status.Code(err) != codes.Unavailable {
			t.Fatalf("unknown key, issuer down: %v, want UNAVAILABLE", err)
		}
	}
	if _, err := v.Authenticate(ctx, tokenBy(k2, "k1")); err == nil || status.Code(err) == codes.Unavailable {
		t.Fatalf("a held key's bad signature, issuer down: %v, want refused, not UNAVAILABLE", err)
	}
	if _, err := v.Authenticate(ctx, tokenBy(k1, "k1")); err != nil {
		t.Fatalf("held key, issuer down: %v", err)
	}
}

func mintTimes(t *testing.T, signer jose.Signer, iss string, iat, exp time.Time) string {
	t.Helper()
	tok, err := jwt.Signed(signer).Claims(jwt.Claims{Issuer: iss, Subject: "alice", Audience: jwt.Audience{"orders"},
		IssuedAt: jwt.NewNumericDate(iat), Expiry: jwt.NewNumericDate(exp)}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// ClockLeeway: a token expired 10 s ago, or issued 10 s in the future, is
// accepted; 60 s is refused.
func TestClockLeewayOnExpiryAndIssuedAt(t *testing.T) {
	t.Parallel()
	iss := newTestIssuer(t)
	v, err := server.NewOIDCVerifier(server.OIDCConfig{Issuer: iss.url, Audience: "orders"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	server.SetClock(v, func() time.Time { return now })
	ctx := context.Background()
	cases := []struct {
		name     string
		iat, exp time.Time
		ok       bool
	}{
		{"expired 10s ago", now.Add(-time.Hour), now.Add(-10 * time.Second), true},
		{"expired 60s ago", now.Add(-time.Hour), now.Add(-60 * time.Second), false},
		{"issued 10s ahead", now.Add(10 * time.Second), now.Add(time.Hour), true},
		{"issued 60s ahead", now.Add(60 * time.Second), now.Add(time.Hour), false},
	}
	for _, c := range cases {
		_, err := v.Authenticate(ctx, mintTimes(t, iss.signer, iss.url, c.iat, c.exp))
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want accepted=%v", c.name, err, c.ok)
		}
	}
}

func TestKeyURLsMustBeHTTPSExceptOnLoopback(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"https://accounts.google.com", "http://127.0.0.1:8086", "http://127.1.2.3", "http://[::1]:80", "http://localhost:8086"} {
		if err := server.CheckKeyURL(u, false); err != nil {
			t.Errorf("%s: %v, want accepted", u, err)
		}
	}
	for _, u := range []string{"http://localissuer:8086", "http://10.0.0.1", "http://[2001:db8::1]", "ftp://x", "accounts.google.com"} {
		if err := server.CheckKeyURL(u, false); err == nil {
			t.Errorf("%s: accepted, want refused", u)
		}
	}
	if err := server.CheckKeyURL("http://localissuer:8086", true); err != nil {
		t.Errorf("AllowHTTP: %v", err)
	}
	err := server.OIDCConfig{Issuer: "http://issuer.example", Audience: "a", JWKSURL: "http://keys.example/jwks"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "issuer") || !strings.Contains(err.Error(), "JWKS") {
		t.Errorf("Validate = %v, want issuer and JWKS URL refused", err)
	}
}
