// The console's side of OperatorHeader: how a process that logs operators in
// calls the operator services for them.

package operator

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// ConsoleDialOptions are the dial options of a console's connection to a
// service's operator services. The console names the logged-in operator on
// a call's context (metadata.AppendToOutgoingContext(ctx, OperatorHeader,
// name)), and only such a call carries a credential: a call that names
// nobody (an anonymous read-only page) carries none, so it cannot spend the
// console's identity.
//
// With idTokens, the console's ID tokens for the service's audience, the
// call keeps the header and the guard records "console:<console>/<name>"
// (the console must be in the service's AUTH_CONSOLES). With idTokens nil
// the call carries breakGlass instead, without the name, and the guard
// records BreakGlass: a console with no identity of its own (a stack run
// without authentication).
func ConsoleDialOptions(idTokens credentials.PerRPCCredentials, breakGlass string) []grpc.DialOption {
	// attach returns ctx and opts for one call: unchanged when it names no
	// operator.
	attach := func(ctx context.Context, opts []grpc.CallOption) (context.Context, []grpc.CallOption) {
		md, ok := metadata.FromOutgoingContext(ctx)
		if !ok || len(md.Get(OperatorHeader)) == 0 {
			return ctx, opts
		}
		md = md.Copy()
		md.Delete("authorization") // the console's credential, nobody else's
		if idTokens != nil {
			return metadata.NewOutgoingContext(ctx, md), append(opts, grpc.PerRPCCredentials(idTokens))
		}
		md.Delete(OperatorHeader)
		if breakGlass != "" {
			md.Set("authorization", "Bearer "+breakGlass)
		}
		return metadata.NewOutgoingContext(ctx, md), opts
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			ctx, opts = attach(ctx, opts)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			ctx, opts = attach(ctx, opts)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// WithoutOperator removes the OperatorHeader from the calls of a
// connection: a console's calls to public APIs, which name their caller by
// the console's own token and have no use for the operator's name.
func WithoutOperator() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(OperatorHeader)) > 0 {
			md = md.Copy()
			md.Delete(OperatorHeader)
			ctx = metadata.NewOutgoingContext(ctx, md)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}
