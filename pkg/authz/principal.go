package authz

import (
	"context"

	"github.com/lossless-dev/lossless/pkg/server"
)

// Kind is what a principal was admitted as.
type Kind int

// The kinds of principal the Authorizer puts in a context.
const (
	_ Kind = iota
	// KindClient: listed in AUTH_CLIENTS, acting for its Customers.
	KindClient
	// KindPeer: a service in the peer allow-list. It acts for no customer
	// of its own: the service the peer is trusts it for the request's.
	KindPeer
)

// Principal is the verified caller of a request and what it was admitted
// as.
type Principal struct {
	Caller    server.Caller
	Kind      Kind
	Customers Customers // a client's; empty for a peer
}

type principalKey struct{}

// ContextWithPrincipal returns ctx carrying p, as the Authorizer does; for
// code that runs a handler in-process on a principal's behalf, and tests.
func ContextWithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal the Authorizer admitted; false when the
// request did not pass through it (a handler must then refuse).
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// MayActFor reports whether ctx's principal is a client that may act for
// customerID. False without a principal: fail closed.
func MayActFor(ctx context.Context, customerID string) bool {
	p, ok := FromContext(ctx)
	return ok && p.Kind == KindClient && p.Customers.Has(customerID)
}

// CustomersOf returns the customers ctx's principal may read, for a query's
// filter (Customers.IDs, nil when All); the zero set (none) without a
// client principal.
func CustomersOf(ctx context.Context) Customers {
	p, ok := FromContext(ctx)
	if !ok || p.Kind != KindClient {
		return Customers{}
	}
	return p.Customers
}
