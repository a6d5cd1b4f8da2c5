package authz

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"
)

// Rule is who may call a method.
type Rule int

// The rules. The zero Rule is not one: a Policy entry must say which.
const (
	_ Rule = iota
	// Open: anyone, no token (gRPC health checks, server reflection).
	// WithCallerAuth exempts these services too.
	Open
	// Client: a caller listed in AUTH_CLIENTS; what it may touch is then
	// limited to its customers by the handler (MayActFor, Customers).
	Client
	// Peer: a service listed in the callee's peer allow-list
	// (PROVIDER_ALLOWED_CALLERS).
	Peer
	// Operator: an operator surface. Its own guard decides (pkg/operator:
	// operator identities, the console, the break-glass token); this
	// package lets the call through to it. Served on the admin listener.
	Operator
)

func (r Rule) String() string {
	switch r {
	case Open:
		return "open"
	case Client:
		return "client"
	case Peer:
		return "peer"
	case Operator:
		return "operator"
	}
	return fmt.Sprintf("Rule(%d)", int(r))
}

// Policy maps full gRPC method names ("/package.Service/Method") to their
// Rule. A method without an entry is refused.
type Policy map[string]Rule

// Methods returns the full names of every method (unary and streaming) of
// the services.
func Methods(services ...*grpc.ServiceDesc) []string {
	var out []string
	for _, sd := range services {
		for _, m := range sd.Methods {
			out = append(out, "/"+sd.ServiceName+"/"+m.MethodName)
		}
		for _, s := range sd.Streams {
			out = append(out, "/"+sd.ServiceName+"/"+s.StreamName)
		}
	}
	return out
}

// Reflection's services; not grpc.ServiceDescs this module links.
const (
	reflectionV1  = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
	reflectionV1a = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
)

// Infrastructure returns the rules every server shares: gRPC health and
// reflection are Open.
func Infrastructure() Policy {
	p := Policy{reflectionV1: Open, reflectionV1a: Open}
	return p.With(Open, &healthgrpc.Health_ServiceDesc)
}

// With returns a copy of p where every method of services has rule r, for a
// whole service under one guard (an operator surface). A public service's
// methods are better listed one by one: the table is the documentation.
func (p Policy) With(r Rule, services ...*grpc.ServiceDesc) Policy {
	out := make(Policy, len(p))
	for m, rule := range p {
		out[m] = rule
	}
	for _, m := range Methods(services...) {
		out[m] = r
	}
	return out
}

// Merge returns a copy of p with q's entries added; q wins where both name
// a method.
func (p Policy) Merge(q Policy) Policy {
	out := make(Policy, len(p)+len(q))
	for m, r := range p {
		out[m] = r
	}
	for m, r := range q {
		out[m] = r
	}
	return out
}

// Missing returns the methods of the registered services (as
// grpc.Server.GetServiceInfo lists them) that p has no valid rule for,
// sorted: an app checks it once its services are registered, so a
// forgotten method fails the start, not a caller.
func (p Policy) Missing(services map[string]grpc.ServiceInfo) []string {
	var out []string
	for name, info := range services {
		for _, m := range info.Methods {
			full := "/" + name + "/" + m.Name
			if r := p[full]; r < Open || r > Operator {
				out = append(out, full)
			}
		}
	}
	slices.Sort(out)
	return out
}

// String lists the entries, sorted by method, one per line.
func (p Policy) String() string {
	ms := make([]string, 0, len(p))
	for m := range p {
		ms = append(ms, m)
	}
	slices.Sort(ms)
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "%s %s\n", m, p[m])
	}
	return b.String()
}
