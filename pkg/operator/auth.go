// The guard admits operator-only gRPC methods to a bearer credential
// (`authorization: Bearer <credential>`; the REST gateway forwards the HTTP
// Authorization header as that metadata): an operator's ID token, a
// console's ID token acting for a named operator, or the shared break-glass
// token (identities.go). It fails closed: with neither identities nor a
// token every guarded call is refused. Refusals are logged with the
// caller's address, and an address that keeps presenting refused
// credentials is refused with RESOURCE_EXHAUSTED for the rest of a window
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

	"github.com/lossless-dev/lossless/pkg/server"
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

// Guard admits the operators of guarded methods and names them: the
// break-glass token, or an ID token of an identity in Identities.
type Guard struct {
	digest  [32]byte
	armed   bool // the break-glass token is set
	envName string
	logger  *slog.Logger
	limit   *refusals
	ids     Identities
	gateway *GatewayMark
}

// NewGuard returns a guard for the break-glass token, read from the
// environment variable envName (named in refusals and errors), and the
// identities of WithIdentities. With neither, every guarded call is refused
// with PERMISSION_DENIED.
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
	if err := o.ids.validate(); err != nil {
		return nil, err
	}
	g := &Guard{armed: token != "", envName: envName, logger: logger, limit: newRefusals(o), ids: o.ids, gateway: o.gateway}
	if g.armed {
		g.digest = sha256.Sum256([]byte(token))
	}
	if !g.armed && !g.ids.enabled() {
		logger.Warn("operator: neither " + envName + " nor operator identities are set; operator endpoints refuse every call")
	}
	return g, nil
}

// Interceptor refuses calls to the given full method names
// ("/package.Service/Method") without an operator's credential, before
// anything else runs (register it with server.WithAuthInterceptors, ahead
// of request validation), and puts the operator in the handler's context
// (PrincipalFrom). Other methods pass through untouched. Prefer
// ServiceInterceptor for a service: a list of guarded methods leaves a
// method added later open.
func (g *Guard) Interceptor(fullMethods ...string) grpc.UnaryServerInterceptor {
	guarded := methodSet(fullMethods)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !guarded[info.FullMethod] {
			return handler(ctx, req)
		}
		ctx, err := g.Verify(ctx)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor is Interceptor for streaming methods.
func (g *Guard) StreamInterceptor(fullMethods ...string) grpc.StreamServerInterceptor {
	guarded := methodSet(fullMethods)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !guarded[info.FullMethod] {
			return handler(srv, ss)
		}
		return g.stream(srv, ss, handler)
	}
}

// ServiceInterceptor guards every method of the gRPC service serviceName
// ("package.Service"), like Interceptor, except the methods named in open
// (bare names, "GetFaults"); other services pass through. Guarding the
// service rather than listing its methods fails closed: a method added
// later is guarded until someone opens it here.
func (g *Guard) ServiceInterceptor(serviceName string, open ...string) grpc.UnaryServerInterceptor {
	guarded := serviceMatcher(serviceName, open)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !guarded(info.FullMethod) {
			return handler(ctx, req)
		}
		ctx, err := g.Verify(ctx)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// ServiceStreamInterceptor is ServiceInterceptor for the service's
// streaming methods; register both, or a streaming method added later is
// open.
func (g *Guard) ServiceStreamInterceptor(serviceName string, open ...string) grpc.StreamServerInterceptor {
	guarded := serviceMatcher(serviceName, open)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !guarded(info.FullMethod) {
			return handler(srv, ss)
		}
		return g.stream(srv, ss, handler)
	}
}

func (g *Guard) stream(srv any, ss grpc.ServerStream, handler grpc.StreamHandler) error {
	ctx, err := g.Verify(ss.Context())
	if err != nil {
		return err
	}
	return handler(srv, principalStream{ServerStream: ss, ctx: ctx})
}

// principalStream is a stream whose context carries the verified operator.
type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s principalStream) Context() context.Context { return s.ctx }

func methodSet(fullMethods []string) map[string]bool {
	m := make(map[string]bool, len(fullMethods))
	for _, f := range fullMethods {
		m[f] = true
	}
	return m
}

func serviceMatcher(serviceName string, open []string) func(string) bool {
	prefix := "/" + serviceName + "/"
	exempt := make(map[string]bool, len(open))
	for _, m := range open {
		exempt[prefix+m] = true
	}
	return func(full string) bool { return strings.HasPrefix(full, prefix) && !exempt[full] }
}

// Authorize is Verify without the context: nil when the call is an
// operator's.
func (g *Guard) Authorize(ctx context.Context) error {
	_, err := g.Verify(ctx)
	return err
}

// Verify checks the incoming metadata and returns ctx with the verified
// operator (PrincipalFrom). In order: the break-glass token (compared
// constant-time over SHA-256 digests, so neither its content nor its length
// leaks) is BreakGlass; else the bearer must be an ID token the
// Identities' Authenticator verifies, of an identity in Operators (without
// the OperatorHeader) or in Consoles (with it). A caller address blocked for
// refused credentials is refused before its credential is looked at
// (RESOURCE_EXHAUSTED with RetryInfo): even a good one from it waits, or the
// limit would still answer every guess.
func (g *Guard) Verify(ctx context.Context) (context.Context, error) {
	if p, ok := PrincipalFrom(ctx); ok && p != "" {
		return ctx, nil // verified by the interceptor; the method checks again
	}
	addr := g.peerAddress(ctx)
	if !g.armed && !g.ids.enabled() {
		g.logger.WarnContext(ctx, "operator: call refused: "+g.envName+" is not set", "peer", addr)
		return ctx, status.Error(codes.PermissionDenied, "operator endpoint disabled: "+g.envName+" is not set")
	}
	if wait, first := g.limit.blocked(addr); wait > 0 {
		if first { // once per block: the refusals that follow are its echo
			g.logger.WarnContext(ctx, "operator: address blocked: too many wrong operator tokens",
				"peer", addr, "retry_after", wait)
		}
		return ctx, tooManyFailures(wait)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		g.logger.InfoContext(ctx, "operator: call without an operator token refused", "peer", addr)
		return ctx, status.Error(codes.Unauthenticated, "missing operator credential (authorization: Bearer <ID token or operator token>)")
	}
	if len(vals[0]) > server.MaxAuthorizationBytes {
		// Neither hashed nor parsed; counted as a wrong credential.
		g.limit.fail(addr)
		g.logger.WarnContext(ctx, "operator: oversized credential refused", "peer", addr, "bytes", len(vals[0]))
		return ctx, status.Errorf(codes.Unauthenticated, "authorization over %d bytes refused", server.MaxAuthorizationBytes)
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	got := sha256.Sum256([]byte(tok))
	if ok && g.armed && subtle.ConstantTimeCompare(got[:], g.digest[:]) == 1 {
		g.logger.InfoContext(ctx, "operator: break-glass token used", "peer", addr)
		return withPrincipal(ctx, BreakGlass), nil
	}
	if ok && tok != "" && g.ids.enabled() {
		principal, err := g.ids.principal(ctx, tok, md.Get(OperatorHeader))
		if status.Code(err) == codes.Unavailable {
			return ctx, err // the issuer's keys are unreachable: not the caller's fault
		}
		if err == nil {
			return withPrincipal(ctx, principal), nil
		}
		g.limit.fail(addr)
		g.logger.WarnContext(ctx, "operator: operator credential refused", "peer", addr, "reason", err.Error())
		return ctx, status.Error(codes.PermissionDenied, "operator credential refused: "+err.Error())
	}
	g.limit.fail(addr)
	g.logger.WarnContext(ctx, "operator: call with a wrong operator token refused", "peer", addr)
	return ctx, status.Error(codes.PermissionDenied, "operator token refused")
}

// LogIn verifies the credential of an operator command run in process
// (bearer: an ID token or the break-glass token; operatorName: the
// OperatorHeader a console sends, "" for none) as Verify does a call's, and
// returns the principal for ActingAs.
func (g *Guard) LogIn(ctx context.Context, bearer, operatorName string) (string, error) {
	md := metadata.Pairs("authorization", "Bearer "+bearer)
	if operatorName != "" {
		md.Append(OperatorHeader, operatorName)
	}
	ctx, err := g.Verify(metadata.NewIncomingContext(ctx, md))
	if err != nil {
		return "", err
	}
	p, _ := PrincipalFrom(ctx)
	return p, nil
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
