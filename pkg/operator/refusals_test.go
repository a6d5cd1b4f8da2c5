package operator_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/operator"
)

// clock is a settable time for the refusal windows.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// syncBuffer is a log sink the server's goroutines may write concurrently.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// healthClient serves the gRPC health service behind g.ServiceInterceptor
// (Check guarded, List open) on loopback and returns a client.
func healthClient(t *testing.T, g *operator.Guard) healthpb.HealthClient {
	t.Helper()
	var lc net.ListenConfig
	lis, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(g.ServiceInterceptor(healthpb.Health_ServiceDesc.ServiceName, "List")))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// gatewayMark is the process's mark the tests' "gateway" (from) sends.
var gatewayMark = func() *operator.GatewayMark {
	m, err := operator.NewGatewayMark()
	if err != nil {
		panic(err)
	}
	return m
}()

// from is a call relayed by the REST gateway for the HTTP client at ip
// (the gateway appends the client's address to x-forwarded-for and adds
// the process's mark), carrying auth when not empty.
func from(ip, auth string) context.Context {
	md := metadata.Join(metadata.Pairs("x-forwarded-for", ip), operator.GatewayMarkPairs(gatewayMark))
	if auth != "" {
		md.Append("authorization", auth)
	}
	return metadata.NewOutgoingContext(context.Background(), md)
}

func TestWrongTokensFromOneAddressAreLimitedAndLogged(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	logs := &syncBuffer{}
	g, err := operator.NewGuard(token, "X_TOKEN", slog.New(slog.NewTextHandler(logs, nil)),
		operator.WithRefusalLimit(3, time.Minute, 0), operator.WithClock(clk.now), operator.WithGatewayMark(gatewayMark))
	if err != nil {
		t.Fatal(err)
	}
	c := healthClient(t, g)
	check := func(ctx context.Context) error {
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	good, bad := "Bearer "+token, "Bearer guess"

	// Successes are neither counted nor delayed.
	for range 10 {
		if err := check(from("198.51.100.7", good)); err != nil {
			t.Fatalf("right token: %v", err)
		}
	}
	for i := range 3 {
		if err := check(from("198.51.100.7", bad)); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("wrong token #%d: %v, want PERMISSION_DENIED", i+1, err)
		}
	}
	clk.add(10 * time.Second)
	for _, auth := range []string{bad, good, ""} {
		err := check(from("198.51.100.7", auth))
		if status.Code(err) != codes.ResourceExhausted || apierror.RetryAfter(err) != 50*time.Second {
			t.Fatalf("after 3 wrong tokens, %q: %v (retry after %v), want RESOURCE_EXHAUSTED retry after 50s",
				auth, err, apierror.RetryAfter(err))
		}
	}
	// Another address is not affected, and an open method stays open.
	if err := check(from("198.51.100.8", good)); err != nil {
		t.Fatalf("right token from another address: %v", err)
	}
	if _, err := c.List(from("198.51.100.7", ""), &healthpb.HealthListRequest{}); err != nil {
		t.Fatalf("open method from the blocked address: %v", err)
	}
	clk.add(50 * time.Second)
	if err := check(from("198.51.100.7", good)); err != nil {
		t.Fatalf("right token once the window ended: %v", err)
	}
	if err := check(from("198.51.100.7", bad)); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("wrong token in a new window: %v, want PERMISSION_DENIED", err)
	}
	if err := check(from("198.51.100.7", "")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want UNAUTHENTICATED", err)
	}

	out := logs.String()
	if n := strings.Count(out, "address blocked"); n != 1 {
		t.Errorf("the block was logged %d times, want once (3 refusals):\n%s", n, out)
	}
	for _, want := range []string{
		`msg="operator: call with a wrong operator token refused" peer=198.51.100.7`,
		`msg="operator: address blocked: too many wrong operator tokens" peer=198.51.100.7`,
		`msg="operator: call without an operator token refused" peer=198.51.100.7`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// A peer cannot choose its address with x-forwarded-for: only a call that
// carries the process's gateway mark (its own REST gateway) is believed, from
// a remote address or from loopback (another local process) alike.
func TestForwardedForIsBelievedOnlyFromTheGateway(t *testing.T) {
	t.Parallel()
	for _, peerIP := range []string{"203.0.113.9", "127.0.0.1"} {
		g, err := operator.NewGuard(token, "X_TOKEN", slog.New(slog.DiscardHandler), operator.WithRefusalLimit(1, time.Minute, 0),
			operator.WithGatewayMark(gatewayMark))
		if err != nil {
			t.Fatal(err)
		}
		remote := func(forwarded string, marked bool) context.Context {
			ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(peerIP), Port: 40000}})
			md := metadata.Pairs("x-forwarded-for", forwarded, "authorization", "Bearer guess")
			if marked {
				md = metadata.Join(md, operator.GatewayMarkPairs(gatewayMark))
			}
			return metadata.NewIncomingContext(ctx, md)
		}
		if err := g.Authorize(remote("192.0.2.1", false)); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("%s: first wrong token: %v", peerIP, err)
		}
		if err := g.Authorize(remote("192.0.2.2", false)); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("%s: second wrong token from the same peer, other x-forwarded-for: %v, want RESOURCE_EXHAUSTED", peerIP, err)
		}
		// The gateway's calls are keyed by their HTTP client: another client
		// is not blocked by the peer's refusals.
		if err := g.Authorize(remote("192.0.2.3", true)); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("%s: the gateway relaying another client: %v, want PERMISSION_DENIED", peerIP, err)
		}
		// A forged mark is not the process's.
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(peerIP), Port: 1}})
		forged := metadata.Join(metadata.Pairs("x-forwarded-for", "192.0.2.4", "authorization", "Bearer guess"),
			operator.GatewayMarkPairs(mustMark(t)))
		if err := g.Authorize(metadata.NewIncomingContext(ctx, forged)); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("%s: another process's mark: %v, want RESOURCE_EXHAUSTED (keyed by the peer)", peerIP, err)
		}
	}
}

func mustMark(t *testing.T) *operator.GatewayMark {
	t.Helper()
	m, err := operator.NewGatewayMark()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// IPv6 callers are keyed by their /64: a host holding the prefix cannot
// escape the limit by changing its interface id; another /64 is not
// affected.
func TestIPv6IsLimitedPerSlash64(t *testing.T) {
	t.Parallel()
	g, err := operator.NewGuard(token, "X_TOKEN", slog.New(slog.DiscardHandler), operator.WithRefusalLimit(1, time.Minute, 0))
	if err != nil {
		t.Fatal(err)
	}
	at := func(ip string) error {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 1}})
		return g.Authorize(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer guess")))
	}
	if err := at("2001:db8:1:2::1"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("first wrong token: %v", err)
	}
	if err := at("2001:db8:1:2:ffff::9"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("same /64: %v, want RESOURCE_EXHAUSTED", err)
	}
	if err := at("2001:db8:1:3::1"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("another /64: %v, want PERMISSION_DENIED", err)
	}
}

// The tracked addresses are bounded: when the map is full, the oldest
// window is dropped for a new address.
func TestRefusalMapIsBounded(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	g, err := operator.NewGuard(token, "X_TOKEN", slog.New(slog.DiscardHandler),
		operator.WithRefusalLimit(1, time.Hour, 2), operator.WithClock(clk.now))
	if err != nil {
		t.Fatal(err)
	}
	at := func(ip, auth string) error {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 1}})
		return g.Authorize(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", auth)))
	}
	for _, ip := range []string{"192.0.2.1", "192.0.2.2"} {
		_ = at(ip, "Bearer guess")
		clk.add(time.Second)
	}
	if err := at("192.0.2.1", "Bearer "+token); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("blocked address: %v, want RESOURCE_EXHAUSTED", err)
	}
	_ = at("192.0.2.3", "Bearer guess") // the map is full: 192.0.2.1's window goes
	if err := at("192.0.2.1", "Bearer "+token); err != nil {
		t.Fatalf("evicted address: %v, want admitted", err)
	}
	if err := at("192.0.2.2", "Bearer "+token); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("address still tracked: %v, want RESOURCE_EXHAUSTED", err)
	}
}
