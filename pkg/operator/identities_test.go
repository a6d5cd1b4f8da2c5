package operator_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
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

	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/server"
)

// issuer stands in for the service's ID-token verifier: a token is the
// caller it names; "down" is the issuer's keys out of reach.
type issuer map[string]server.Caller

func (i issuer) Authenticate(_ context.Context, tok string) (server.Caller, error) {
	if tok == "down" {
		return server.Caller{}, status.Error(codes.Unavailable, "cannot verify tokens now")
	}
	c, ok := i[tok]
	if !ok {
		return server.Caller{}, errors.New("token signature invalid")
	}
	return c, nil
}

var tokens = issuer{
	"alice-token":   {Subject: "1001", Email: "alice@example.com"},
	"console-token": {Subject: "console-client"},
	"mallory-token": {Subject: "1666", Email: "mallory@example.com"},
	// A console whose name leaves too little of the audit's actor for a
	// long operator name.
	"long-console-token": {Subject: "console-" + strings.Repeat("l", 80)},
}

func identityGuard(t *testing.T, opts ...operator.GuardOption) *operator.Guard {
	t.Helper()
	g, err := operator.NewGuard(token, "X_TOKEN", slog.New(slog.DiscardHandler), append([]operator.GuardOption{
		operator.WithIdentities(operator.Identities{Auth: tokens, Operators: []string{"alice@example.com"}, Consoles: []string{"console-client", "console-" + strings.Repeat("l", 80)}}),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// verify calls g's unary interceptor with the bearer and operator header
// (when not empty) and returns the principal the handler saw.
func verify(g *operator.Guard, bearer string, header ...string) (string, error) {
	md := metadata.Pairs("authorization", "Bearer "+bearer)
	for _, h := range header {
		md.Append(operator.OperatorHeader, h)
	}
	var seen string
	_, err := g.Interceptor("/svc/Guarded")(metadata.NewIncomingContext(context.Background(), md), nil,
		&grpc.UnaryServerInfo{FullMethod: "/svc/Guarded"}, func(ctx context.Context, _ any) (any, error) {
			seen, _ = operator.PrincipalFrom(ctx)
			return nil, nil
		})
	return seen, err
}

// The guard names who acts: the break-glass token, an operator's own ID
// token, or a console's with the operator it acts for.
func TestGuardRecordsTheVerifiedPrincipal(t *testing.T) {
	t.Parallel()
	g := identityGuard(t)
	for _, c := range []struct {
		bearer string
		header []string
		want   string
	}{
		{token, nil, operator.BreakGlass},
		{"alice-token", nil, "alice@example.com"},
		{"console-token", []string{"bob"}, "console:console-client/bob"},
		{"console-token", []string{"Zoë Ünal"}, "console:console-client/Zoë Ünal"},
	} {
		got, err := verify(g, c.bearer, c.header...)
		if err != nil || got != c.want {
			t.Errorf("%s %q: %q, %v; want %q", c.bearer, c.header, got, err, c.want)
		}
	}
}

// Anything else is PERMISSION_DENIED: an identity in neither list, a token
// the issuer does not sign, a console without the operator header (or with
// a bad one), an operator with it.
func TestGuardRefusesWhatIsNotAnOperator(t *testing.T) {
	t.Parallel()
	g := identityGuard(t)
	for _, c := range []struct {
		bearer string
		header []string
		why    string
	}{
		{"mallory-token", nil, "neither an operator nor a console"},
		{"forged", nil, "signature"},
		{"console-token", nil, "must name its operator"},
		{"console-token", []string{""}, "empty"},
		{"console-token", []string{strings.Repeat("b", operator.MaxOperatorName+1)}, "longer than 120"},
		{"console-token", []string{"bob\x07"}, "not printable"},
		{"long-console-token", []string{strings.Repeat("b", operator.MaxOperatorName)}, "the audit at most 200"},
		{"console-token", []string{"bob", "carol"}, "once"},
		{"alice-token", []string{"bob"}, "not a console"},
		{"", nil, "refused"},
	} {
		got, err := verify(g, c.bearer, c.header...)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.why) || got != "" {
			t.Errorf("%s %q: %q, %v; want PERMISSION_DENIED saying %q", c.bearer, c.header, got, err, c.why)
		}
	}
}

// Refused ID tokens count toward the address's limit as wrong tokens do;
// an issuer out of reach is UNAVAILABLE and not the caller's fault.
func TestRefusedIdentitiesAreLimited(t *testing.T) {
	t.Parallel()
	g := identityGuard(t, operator.WithRefusalLimit(2, time.Minute, 0))
	at := func(bearer string) error {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("192.0.2.50"), Port: 1}})
		return g.Authorize(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+bearer)))
	}
	for range 3 {
		if err := at("down"); status.Code(err) != codes.Unavailable {
			t.Fatalf("issuer down: %v, want UNAVAILABLE", err)
		}
	}
	for range 2 {
		if err := at("mallory-token"); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("unlisted identity: %v, want PERMISSION_DENIED", err)
		}
	}
	if err := at("alice-token"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("after 2 refusals: %v, want RESOURCE_EXHAUSTED", err)
	}
}

// Without the token and identities every call is refused; an anonymous
// authenticator (AUTH_DISABLED) verifies no operator.
func TestGuardWithoutCredentialsRefusesIdentities(t *testing.T) {
	t.Parallel()
	g, err := operator.NewGuard("", "X_TOKEN", slog.New(slog.DiscardHandler),
		operator.WithIdentities(operator.Identities{Auth: server.AnonymousAuthenticator{}, Operators: []string{"alice@example.com"}}))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := verify(g, "alice-token"); status.Code(err) != codes.PermissionDenied || got != "" {
		t.Fatalf("anonymous authenticator: %q, %v; want PERMISSION_DENIED", got, err)
	}
	if _, err := operator.NewGuard("", "X_TOKEN", slog.New(slog.DiscardHandler),
		operator.WithIdentities(operator.Identities{Auth: tokens, Operators: []string{"anonymous"}})); err == nil {
		t.Fatal("the anonymous caller listed as an operator was accepted")
	}
}

// The stream interceptors guard streaming methods as the unary ones do,
// and the handler's stream context carries the principal.
func TestStreamInterceptorGuardsStreamingMethods(t *testing.T) {
	t.Parallel()
	g := identityGuard(t)
	var lc net.ListenConfig
	seen := make(chan string, 4)
	record := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, _ := operator.PrincipalFrom(ss.Context())
		seen <- p
		return handler(srv, ss)
	}
	for name, icpt := range map[string]grpc.StreamServerInterceptor{
		"service": g.ServiceStreamInterceptor(healthpb.Health_ServiceDesc.ServiceName, "List"),
		"methods": g.StreamInterceptor("/grpc.health.v1.Health/Watch"),
	} {
		srv := grpc.NewServer(grpc.ChainStreamInterceptor(icpt, record))
		hs := health.NewServer()
		healthpb.RegisterHealthServer(srv, hs)
		lis, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		c := healthpb.NewHealthClient(conn)
		watch := func(md ...string) error {
			ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), metadata.Pairs(md...)), 30*time.Second)
			defer cancel()
			st, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}
		if err := watch(); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("%s: Watch without a credential: %v, want UNAUTHENTICATED", name, err)
		}
		if err := watch("authorization", "Bearer mallory-token"); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("%s: Watch by mallory: %v, want PERMISSION_DENIED", name, err)
		}
		if err := watch("authorization", "Bearer console-token", operator.OperatorHeader, "bob"); err != nil {
			t.Fatalf("%s: Watch by the console for bob: %v", name, err)
		}
		if p := <-seen; p != "console:console-client/bob" {
			t.Fatalf("%s: the stream's principal is %q", name, p)
		}
	}
}
