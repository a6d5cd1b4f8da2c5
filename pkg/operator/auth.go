// The operator token guards operator-only gRPC methods with a bearer token
// (`authorization: Bearer <token>`; the REST gateway forwards the HTTP
// Authorization header as that metadata). It fails closed: without a
// configured token every guarded call is refused. Refusals are logged with
// the caller's address, and an address that keeps presenting wrong tokens
// is refused with RESOURCE_EXHAUSTED for the rest of a window
// (WithRefusalLimit), so the token cannot be guessed at line rate.

package operator

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
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
	limit   *refusals
}

// NewGuard returns a guard for token, read from the environment variable envName
// (named in refusals and errors). An empty token disarms the guard: every
// guarded call is refused with PERMISSION_DENIED.
func NewGuard(token, envName string, logger *slog.Logger, opts ...GuardOption) (*Guard, error) {
	if logger == nil || envName == "" {
		return nil, errors.New("operator: NewGuard needs a logger and the variable name")
	}
	if err := ValidateToken(envName, token); err != nil {
		return nil, err
	}
	o := guardOptions{failures: DefaultRefusalFailures, window: DefaultRefusalWindow, peers: DefaultRefusalPeers, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	g := &Guard{armed: token != "", envName: envName, logger: logger, limit: newRefusals(o)}
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
// validation). Other methods pass through untouched. Prefer
// ServiceInterceptor for a service: a list of guarded methods leaves a
// method added later open.
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
// ("package.Service"), like Interceptor, except the methods named in open
// (bare names, "GetFaults"); other services pass through. Guarding the
// service rather than listing its methods fails closed: a method added
// later is guarded until someone opens it here.
func (g *Guard) ServiceInterceptor(serviceName string, open ...string) grpc.UnaryServerInterceptor {
	prefix := "/" + serviceName + "/"
	exempt := make(map[string]bool, len(open))
	for _, m := range open {
		exempt[prefix+m] = true
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, prefix) && !exempt[info.FullMethod] {
			if err := g.Authorize(ctx); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}

// Authorize checks the incoming metadata. The comparison is constant-time
// over SHA-256 digests, so neither the token's content nor its length leaks.
// A caller address blocked for wrong tokens is refused before its token is
// looked at (RESOURCE_EXHAUSTED with RetryInfo): even the right token from
// it waits, or the limit would still answer every guess.
func (g *Guard) Authorize(ctx context.Context) error {
	addr := peerAddress(ctx)
	if !g.armed {
		g.logger.WarnContext(ctx, "operator: call refused: "+g.envName+" is not set", "peer", addr)
		return status.Error(codes.PermissionDenied, "operator endpoint disabled: "+g.envName+" is not set")
	}
	if wait, first := g.limit.blocked(addr); wait > 0 {
		if first { // once per block: the refusals that follow are its echo
			g.logger.WarnContext(ctx, "operator: address blocked: too many wrong operator tokens",
				"peer", addr, "retry_after", wait)
		}
		return tooManyFailures(wait)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		g.logger.InfoContext(ctx, "operator: call without an operator token refused", "peer", addr)
		return status.Error(codes.Unauthenticated, "missing operator token (authorization: Bearer <token>)")
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	got := sha256.Sum256([]byte(tok))
	if !ok || subtle.ConstantTimeCompare(got[:], g.digest[:]) != 1 {
		g.limit.fail(addr)
		g.logger.WarnContext(ctx, "operator: call with a wrong operator token refused", "peer", addr)
		return status.Error(codes.PermissionDenied, "operator token refused")
	}
	return nil
}

// tooManyFailures is RESOURCE_EXHAUSTED with the rest of the window as its
// RetryInfo (HTTP 429 through the gateway).
func tooManyFailures(wait time.Duration) error {
	st, err := status.New(codes.ResourceExhausted, "too many wrong operator tokens from this address; retry later").
		WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New((wait + time.Second - 1).Truncate(time.Second))})
	if err != nil {
		return status.Error(codes.ResourceExhausted, "too many wrong operator tokens from this address; retry later")
	}
	return st.Err()
}
