package operator_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/operator"
)

// staticToken is a console's ID tokens: always the same bearer.
type staticToken string

func (s staticToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(s)}, nil
}

func (staticToken) RequireTransportSecurity() bool { return false }

// guardedHealth serves the health service with every method guarded by g,
// and returns a connection dialled with opts and the principals and
// operator headers the handlers saw.
func guardedHealth(t *testing.T, g *operator.Guard, opts ...grpc.DialOption) (healthpb.HealthClient, chan [2]string) {
	t.Helper()
	seen := make(chan [2]string, 8)
	record := func(ctx context.Context) {
		p, _ := operator.PrincipalFrom(ctx)
		md, _ := metadata.FromIncomingContext(ctx)
		h := md.Get(operator.OperatorHeader)
		seen <- [2]string{p, firstOr(h)}
	}
	name := healthpb.Health_ServiceDesc.ServiceName
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(g.ServiceInterceptor(name), func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			record(ctx)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(g.ServiceStreamInterceptor(name), func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			record(ss.Context())
			return h(srv, ss)
		}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var lc net.ListenConfig
	lis, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn), seen
}

func firstOr(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// A console with an identity calls for the operator it names, and is
// recorded as "console:<console>/<operator>", on unary calls and streams;
// a call that names nobody carries no credential at all, and an
// authorization a caller left on the context is replaced by the console's.
func TestConsoleDialOptions_TheConsoleCallsForItsOperator(t *testing.T) {
	t.Parallel()
	c, seen := guardedHealth(t, identityGuard(t), operator.ConsoleDialOptions(staticToken("console-token"), "")...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Check naming no operator: %v, want UNAUTHENTICATED (no credential sent)", err)
	}
	bob := metadata.AppendToOutgoingContext(ctx, operator.OperatorHeader, "bob", "authorization", "Bearer mallory-token")
	if _, err := c.Check(bob, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check for bob: %v", err)
	}
	if got := <-seen; got != [2]string{"console:console-client/bob", "bob"} {
		t.Fatalf("Check for bob: principal and header %q", got)
	}
	st, err := c.Watch(bob, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	if err != nil {
		t.Fatalf("Watch for bob: %v", err)
	}
	if got := <-seen; got[0] != "console:console-client/bob" {
		t.Fatalf("Watch for bob: principal %q", got[0])
	}
}

// A console without an identity (AUTH_DISABLED) calls with the break-glass
// token, recorded as such, and does not pass the operator's name on.
func TestConsoleDialOptions_WithoutIdentityTheBreakGlassToken(t *testing.T) {
	t.Parallel()
	c, seen := guardedHealth(t, identityGuard(t), operator.ConsoleDialOptions(nil, token)...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Check naming no operator: %v, want UNAUTHENTICATED (no credential sent)", err)
	}
	if _, err := c.Check(metadata.AppendToOutgoingContext(ctx, operator.OperatorHeader, "bob"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check for bob: %v", err)
	}
	if got := <-seen; got != [2]string{operator.BreakGlass, ""} {
		t.Fatalf("Check for bob: principal and header %q, want break-glass and none", got)
	}
}

// The console's calls to public APIs lose the operator's name: alice, an
// operator, would be refused for sending it.
func TestWithoutOperator(t *testing.T) {
	t.Parallel()
	c, seen := guardedHealth(t, identityGuard(t), operator.WithoutOperator(), grpc.WithPerRPCCredentials(staticToken("alice-token")))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.Check(metadata.AppendToOutgoingContext(ctx, operator.OperatorHeader, "bob"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got := <-seen; got != [2]string{"alice@example.com", ""} {
		t.Fatalf("principal and header %q, want alice's own call without the header", got)
	}
}
