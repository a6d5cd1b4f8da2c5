// The operator token guards operator-only gRPC methods with a bearer token
// (`authorization: Bearer <token>`; the REST gateway forwards the HTTP
// Authorization header as that metadata). It fails closed: without a
// configured token every guarded call is refused.

package operator

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// MinTokenLength is the shortest token accepted: 32 characters, e.g. the output of
// `openssl rand -hex 16` or more; a short token can be guessed.
const MinTokenLength = 32

// ValidateToken checks a configured token: empty (guarded methods refuse every
// call) or at least MinTokenLength characters. The error names envName.
func ValidateToken(envName, token string) error {
	if token != "" && len(token) < MinTokenLength {
		return fmt.Errorf("%s: the operator token must be at least %d characters (e.g. openssl rand -hex 32), got %d",
			envName, MinTokenLength, len(token))
	}
	return nil
}

// Guard checks the operator token of guarded methods.
type Guard struct {
	digest  [32]byte
	armed   bool
	envName string
	logger  *slog.Logger
}

// NewGuard returns a guard for token, read from the environment variable envName
// (named in refusals and errors). An empty token disarms the guard: every
// guarded call is refused with PERMISSION_DENIED.
func NewGuard(token, envName string, logger *slog.Logger) (*Guard, error) {
	if logger == nil || envName == "" {
		return nil, errors.New("operator: NewGuard needs a logger and the variable name")
	}
	if err := ValidateToken(envName, token); err != nil {
		return nil, err
	}
	g := &Guard{armed: token != "", envName: envName, logger: logger}
	if g.armed {
		g.digest = sha256.Sum256([]byte(token))
	} else {
		logger.Warn("operator: " + envName + " is not set; operator endpoints refuse every call")
	}
	return g, nil
}

// Interceptor refuses calls to the given full method names
// ("/package.Service/Method") without the token, before anything else runs
// (register it with server.WithAuthInterceptors, ahead of request
// validation). Other methods pass through untouched.
func (g *Guard) Interceptor(fullMethods ...string) grpc.UnaryServerInterceptor {
	guarded := make(map[string]bool, len(fullMethods))
	for _, m := range fullMethods {
		guarded[m] = true
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if guarded[info.FullMethod] {
			if err := g.Authorize(ctx); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}

// ServiceInterceptor guards every method of the gRPC service serviceName
// ("package.Service"), like Interceptor; other services pass through.
func (g *Guard) ServiceInterceptor(serviceName string) grpc.UnaryServerInterceptor {
	prefix := "/" + serviceName + "/"
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, prefix) {
			if err := g.Authorize(ctx); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}

// Authorize checks the incoming metadata. The comparison is constant-time
// over SHA-256 digests, so neither the token's content nor its length leaks.
func (g *Guard) Authorize(ctx context.Context) error {
	if !g.armed {
		return status.Error(codes.PermissionDenied, "operator endpoint disabled: "+g.envName+" is not set")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return status.Error(codes.Unauthenticated, "missing operator token (authorization: Bearer <token>)")
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	got := sha256.Sum256([]byte(tok))
	if !ok || subtle.ConstantTimeCompare(got[:], g.digest[:]) != 1 {
		g.logger.WarnContext(ctx, "operator: call with a wrong operator token refused")
		return status.Error(codes.PermissionDenied, "operator token refused")
	}
	return nil
}
