package operator_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/operator"
)

const token = "0123456789abcdef0123456789abcdef"

func call(t *testing.T, g *operator.Guard, method, auth string) codes.Code {
	t.Helper()
	ctx := context.Background()
	if auth != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", auth))
	}
	ran := false
	_, err := g.Interceptor("/svc/Guarded")(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method},
		func(context.Context, any) (any, error) { ran = true; return nil, nil })
	if (err == nil) != ran {
		t.Fatalf("%s: handler ran = %v with error %v", method, ran, err)
	}
	return status.Code(err)
}

func TestGuardAdmitsOnlyTheTokenOnGuardedMethods(t *testing.T) {
	t.Parallel()
	g, err := operator.NewGuard(token, "X_TOKEN", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, auth string
		want         codes.Code
	}{
		{"/svc/Guarded", "", codes.Unauthenticated},
		{"/svc/Guarded", "Bearer wrong", codes.PermissionDenied},
		{"/svc/Guarded", token, codes.PermissionDenied}, // no Bearer scheme
		{"/svc/Guarded", "Bearer " + token, codes.OK},
		// Over server.MaxAuthorizationBytes: refused before it is hashed or parsed.
		{"/svc/Guarded", "Bearer " + strings.Repeat("x", 8<<10), codes.Unauthenticated},
		{"/svc/Open", "", codes.OK},
	} {
		if got := call(t, g, c.method, c.auth); got != c.want {
			t.Errorf("%s with %q: %v, want %v", c.method, c.auth, got, c.want)
		}
	}
}

func TestUnsetTokenRefusesEveryGuardedCall(t *testing.T) {
	t.Parallel()
	g, err := operator.NewGuard("", "X_TOKEN", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for _, auth := range []string{"", "Bearer ", "Bearer " + token} {
		if got := call(t, g, "/svc/Guarded", auth); got != codes.PermissionDenied {
			t.Errorf("with %q: %v, want PERMISSION_DENIED", auth, got)
		}
	}
	if got := call(t, g, "/svc/Open", ""); got != codes.OK {
		t.Errorf("unguarded method: %v", got)
	}
}

func TestShortTokenIsRefusedNamingTheVariable(t *testing.T) {
	t.Parallel()
	_, err := operator.NewGuard("short", "X_TOKEN", slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "X_TOKEN") || !strings.Contains(err.Error(), "32") {
		t.Fatalf("err = %v, want it to name X_TOKEN and the minimum", err)
	}
	if err := operator.ValidateToken("X_TOKEN", ""); err != nil {
		t.Fatalf("empty token (disabled) must be valid: %v", err)
	}
}
