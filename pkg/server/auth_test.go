package server_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"golang.org/x/oauth2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/internal/testpb"
	"github.com/lossless-dev/lossless/pkg/server"
)

// testIssuer serves discovery and a JWKS over HTTP, as a real OIDC issuer.
type testIssuer struct {
	url    string
	signer jose.Signer
}

func newTestIssuer(t testing.TB) *testIssuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ti := &testIssuer{}
	ti.signer = newSigner(t, key, "k1")
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ti.url = srv.URL
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"issuer": ti.url, "jwks_uri": ti.url + "/jwks"})
	})
	mux.HandleFunc("/jwks", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	})
	return ti
}

func newSigner(t testing.TB, key *rsa.PrivateKey, kid string) jose.Signer {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: kid}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mint(t testing.TB, signer jose.Signer, iss, sub, aud string, exp time.Time) string {
	t.Helper()
	tok, err := jwt.Signed(signer).Claims(jwt.Claims{Issuer: iss, Subject: sub, Audience: jwt.Audience{aud},
		IssuedAt: jwt.NewNumericDate(exp.Add(-time.Hour)), Expiry: jwt.NewNumericDate(exp)}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// whoAmI records the caller its handler saw.
type whoAmI struct {
	testpb.UnimplementedOrderServiceServer
	seen chan server.Caller
}

func (w *whoAmI) PutOrder(ctx context.Context, r *testpb.PutOrderRequest) (*testpb.PutOrderResponse, error) {
	c, ok := server.CallerFrom(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no caller")
	}
	w.seen <- c
	return &testpb.PutOrderResponse{Order: r.GetOrder()}, nil
}

func authServer(t *testing.T, cfg server.OIDCConfig) (grpcAddr, httpBase string, seen chan server.Caller) {
	t.Helper()
	v, err := server.NewOIDCVerifier(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second},
		slog.New(slog.DiscardHandler), server.WithCallerAuth(v))
	if err != nil {
		t.Fatal(err)
	}
	w := &whoAmI{seen: make(chan server.Caller, 10)}
	testpb.RegisterOrderServiceServer(srv.GRPC(), w)
	ctx, cancel := context.WithCancel(context.Background())
	if err := testpb.RegisterOrderServiceHandler(ctx, srv.Gateway(), srv.GatewayConn()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server stopped with: %v", err)
		}
	})
	return srv.GRPCAddr(), "http://" + srv.HTTPAddr(), w.seen
}

func TestCallerAuthRefusesMissingAndBadTokensAndPassesTheCaller(t *testing.T) {
	t.Parallel()
	iss := newTestIssuer(t)
	grpcAddr, base, seen := authServer(t, server.OIDCConfig{Issuer: iss.url, Audience: "orders"})
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := testpb.NewOrderServiceClient(conn)
	otherKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Now().Add(time.Hour)
	cases := []struct {
		name, authorization string
	}{
		{"no token", ""},
		{"not bearer", "Basic dXNlcjpwYXNz"},
		{"wrong audience", "Bearer " + mint(t, iss.signer, iss.url, "alice", "billing", hour)},
		{"wrong issuer", "Bearer " + mint(t, iss.signer, "https://elsewhere.example", "alice", "orders", hour)},
		{"expired", "Bearer " + mint(t, iss.signer, iss.url, "alice", "orders", time.Now().Add(-time.Minute))},
		{"bad signature", "Bearer " + mint(t, newSigner(t, otherKey, "k1"), iss.url, "alice", "orders", hour)},
		{"garbage", "Bearer not.a.jwt"},
	}
	for _, c := range cases {
		ctx := context.Background()
		if c.authorization != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", c.authorization)
		}
		// Invalid request too: authentication answers before validation.
		_, err := client.PutOrder(ctx, &testpb.PutOrderRequest{})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: gRPC %v, want UNAUTHENTICATED", c.name, err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, base+"/v1/orders", strings.NewReader(validOrderJSON))
		if c.authorization != "" {
			req.Header.Set("Authorization", c.authorization)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") ||
			body.Code != int(codes.Unauthenticated) || body.Message == "" {
			t.Errorf("%s: HTTP %d WWW-Authenticate %q body %+v, want 401, Bearer and a JSON status",
				c.name, resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body)
		}
	}
	select {
	case c := <-seen:
		t.Fatalf("a refused call reached the handler as %+v", c)
	default:
	}

	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+mint(t, iss.signer, iss.url, "alice", "orders", hour))
	if _, err := client.PutOrder(ctx, validOrder()); err != nil {
		t.Fatalf("valid token: %v", err)
	}
	if c := <-seen; c.Subject != "alice" || c.Issuer != iss.url {
		t.Fatalf("handler saw %+v, want alice of %s", c, iss.url)
	}
	// Health checks carry no token and are exempt.
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check: %v", err)
	}
}

func TestCallerAuthExemptServicesPassWithoutToken(t *testing.T) {
	t.Parallel()
	iss := newTestIssuer(t)
	v, err := server.NewOIDCVerifier(server.OIDCConfig{Issuer: iss.url, Audience: "orders", JWKSURL: iss.url + "/jwks"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, server.WithCallerAuth(v, "lossless.pkgtest.v1.OrderService"))
	resp, err := http.DefaultClient.Do(mustRequest(t, http.MethodPut, b.base+"/v1/orders", validOrderJSON))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || b.fake.calls.Load() != 1 {
		t.Fatalf("exempt service: HTTP %d, %d calls; want 200, 1", resp.StatusCode, b.fake.calls.Load())
	}
}

func TestOIDCConfigValidateNamesWhatIsMissing(t *testing.T) {
	t.Parallel()
	err := server.OIDCConfig{Issuer: "accounts.google.com"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "audience") || !strings.Contains(err.Error(), "issuer") {
		t.Fatalf("Validate = %v, want issuer and audience errors", err)
	}
}

func mustRequest(t *testing.T, method, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TokenCredentials sends its token on every call, except one that carries
// its own authorization (an operator token on the same connection): that
// call reaches the server with its own token alone.
func TestTokenCredentialsYieldToACallsOwnAuthorization(t *testing.T) {
	t.Parallel()
	seen := make(chan []string, 2)
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second},
		slog.New(slog.DiscardHandler), server.WithAuthInterceptors(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			seen <- md.Get("authorization")
			return h(ctx, req)
		}))
	if err != nil {
		t.Fatal(err)
	}
	testpb.RegisterOrderServiceServer(srv.GRPC(), &fakeOrders{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server stopped with: %v", err)
		}
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(server.TokenCredentials(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "id-token"}), false)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := testpb.NewOrderServiceClient(conn)
	if _, err := client.PutOrder(context.Background(), validOrder()); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; len(got) != 1 || got[0] != "Bearer id-token" {
		t.Fatalf("plain call: authorization %q, want the ID token", got)
	}
	own := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer operator-token")
	if _, err := client.PutOrder(own, validOrder()); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; len(got) != 1 || got[0] != "Bearer operator-token" {
		t.Fatalf("call with its own authorization: %q, want that alone", got)
	}
}

// A verified token is answered from memory (OIDCVerifier's verdicts), but
// never past its expiry or VerdictTTL, and a token that failed is never
// remembered.
func TestOIDCVerifierRemembersVerifiedTokensOnlyWhileTheyHold(t *testing.T) {
	t.Parallel()
	iss := newTestIssuer(t)
	v, err := server.NewOIDCVerifier(server.OIDCConfig{Issuer: iss.url, Audience: "orders"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now()
	server.SetClock(v, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	ctx := context.Background()

	short := mint(t, iss.signer, iss.url, "alice", "orders", now.Add(30*time.Second))
	long := mint(t, iss.signer, iss.url, "bob", "orders", now.Add(time.Hour))
	for range 2 {
		if c, err := v.Authenticate(ctx, short); err != nil || c.Subject != "alice" {
			t.Fatalf("short-lived token: %+v, %v; want alice", c, err)
		}
		if c, err := v.Authenticate(ctx, long); err != nil || c.Subject != "bob" {
			t.Fatalf("long-lived token: %+v, %v; want bob", c, err)
		}
	}
	wrong := mint(t, iss.signer, iss.url, "alice", "billing", now.Add(time.Hour))
	for range 2 {
		if _, err := v.Authenticate(ctx, wrong); err == nil {
			t.Fatal("a token for another audience was accepted")
		}
	}
	// Past the short token's expiry and ClockLeeway, within VerdictTTL:
	// its remembered verdict no longer holds.
	advance(31*time.Second + server.ClockLeeway)
	if _, err := v.Authenticate(ctx, short); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired token: %v, want refused as expired", err)
	}
	// Past VerdictTTL the long token is verified again, and still holds.
	advance(server.VerdictTTL)
	if c, err := v.Authenticate(ctx, long); err != nil || c.Subject != "bob" {
		t.Fatalf("long-lived token after VerdictTTL: %+v, %v; want bob", c, err)
	}
}

// BenchmarkOIDCVerifierAuthenticate: one token sent on every call, as the
// services' clients do (verified once, then answered from memory), and a
// new token on each call (an RS256 signature verified every time).
func BenchmarkOIDCVerifierAuthenticate(b *testing.B) {
	iss := newTestIssuer(b)
	v, err := server.NewOIDCVerifier(server.OIDCConfig{Issuer: iss.url, Audience: "orders"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	exp := time.Now().Add(time.Hour)
	tok := mint(b, iss.signer, iss.url, "alice", "orders", exp)
	b.Run("same_token", func(b *testing.B) {
		for b.Loop() {
			if _, err := v.Authenticate(ctx, tok); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new_token", func(b *testing.B) {
		i := 0
		for b.Loop() {
			b.StopTimer()
			i++
			tok := mint(b, iss.signer, iss.url, "alice", "orders", exp.Add(time.Duration(i)*time.Second))
			b.StartTimer()
			if _, err := v.Authenticate(ctx, tok); err != nil {
				b.Fatal(err)
			}
		}
	})
}
