// Package authz decides what an authenticated caller may do: the second
// half of access control, after pkg/server's WithCallerAuth has said who
// calls (docs/adr/0025-authorization.md).
//
// The lesson: authorization is a table, not a scattering of ifs. Each
// service writes one Policy mapping every full gRPC method name to a Rule
// (Open, Client, Peer, Operator), and one Authorizer enforces it in a unary
// and a stream interceptor that run after authentication and before request
// validation. A method the table does not name is refused
// (PERMISSION_DENIED, logged): a method added later without a decision is
// closed, not open. A test enumerates the methods from the proto
// descriptors and fails on any without a rule.
//
// The interceptor can only decide what the method name tells: whether this
// kind of caller may call it at all. What depends on the request's data
// (which customer an order is for, whose invoice is read) is decided in the
// handler, with the Principal the interceptor put in the context: MayActFor
// for one customer, Principal.Customers for the filter a query pushes into
// SQL. A record of another customer is reported as not found, so its
// existence does not leak.
//
// Clients and their customers come from AUTH_CLIENTS
// ("id=cust-a|cust-b,other-id=*", ParseClients); peers from the service's
// own allow-list (PROVIDER_ALLOWED_CALLERS).
package authz
