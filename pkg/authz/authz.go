package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/server"
)

// ErrorInfo reasons of the Authorizer's refusals.
const (
	// ReasonCallerNotAllowed: the caller is authenticated but not listed
	// for the method's rule (AUTH_CLIENTS, the peer allow-list).
	ReasonCallerNotAllowed = "CALLER_NOT_ALLOWED"
	// ReasonNoRule: the method has no entry in the service's Policy.
	ReasonNoRule = "METHOD_WITHOUT_AUTHORIZATION_RULE"
	// ReasonCustomerNotAllowed: a client asked to act for a customer that
	// is not one of its own (RefuseCustomer).
	ReasonCustomerNotAllowed = "CUSTOMER_NOT_ALLOWED"
)

// RefuseCustomer is the answer to a client acting for a customer not its
// own: PERMISSION_DENIED (HTTP 403) with reason CUSTOMER_NOT_ALLOWED and a
// field violation on field (the request's customer field, e.g.
// "work_order.customer_id"). It names only what the caller sent.
func RefuseCustomer(field, customerID string) error {
	msg := fmt.Sprintf("%s: the caller may not act for customer %q (%s)", field, customerID, "AUTH_CLIENTS")
	st, err := status.New(codes.PermissionDenied, msg).WithDetails(
		&errdetails.ErrorInfo{Reason: ReasonCustomerNotAllowed, Domain: apierror.Domain},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field: field, Description: "not one of the caller's customers"}}})
	if err != nil {
		return status.Error(codes.PermissionDenied, msg)
	}
	return st.Err()
}

// Authorizer enforces a Policy.
type Authorizer struct {
	policy  Policy
	clients Clients
	peers   []string
	// peersVar names the peer allow-list in refusals (e.g.
	// PROVIDER_ALLOWED_CALLERS), clientsVar the clients'.
	peersVar, clientsVar string
	log                  *slog.Logger
}

// Config is what an Authorizer admits beyond its Policy.
type Config struct {
	// Clients may call Client methods, for their customers (AUTH_CLIENTS).
	Clients Clients
	// ClientsVar names Clients' source in refusals. Default "AUTH_CLIENTS".
	ClientsVar string
	// Peers may call Peer methods: subjects or verified emails.
	Peers []string
	// PeersVar names Peers' source in refusals, e.g.
	// "PROVIDER_ALLOWED_CALLERS".
	PeersVar string
}

// New returns an Authorizer of policy. logger records refusals for want of
// a rule (a bug, not a caller's mistake).
func New(policy Policy, cfg Config, logger *slog.Logger) (*Authorizer, error) {
	if logger == nil {
		return nil, errors.New("authz: logger is nil")
	}
	if cfg.ClientsVar == "" {
		cfg.ClientsVar = "AUTH_CLIENTS"
	}
	if cfg.PeersVar == "" {
		cfg.PeersVar = "the peer allow-list"
	}
	return &Authorizer{policy: policy.Merge(nil), clients: cfg.Clients.With(Customers{}), peers: slices.Clone(cfg.Peers),
		peersVar: cfg.PeersVar, clientsVar: cfg.ClientsVar, log: logger}, nil
}

// Policy returns a copy of the enforced policy.
func (a *Authorizer) Policy() Policy { return a.policy.Merge(nil) }

// authorize returns ctx with the principal of its request, or the error to
// answer with.
func (a *Authorizer) authorize(ctx context.Context, method string) (context.Context, error) {
	rule, ok := a.policy[method]
	switch {
	case !ok:
		a.log.ErrorContext(ctx, "call refused: the method has no authorization rule", "method", method)
		return ctx, apierror.PermissionDenied(ReasonNoRule, "method "+method+" has no authorization rule")
	case rule == Open, rule == Operator:
		return ctx, nil
	}
	caller, ok := server.CallerFrom(ctx)
	if !ok || caller.Subject == "" {
		return ctx, status.Error(codes.Unauthenticated, "no authenticated caller")
	}
	switch rule {
	case Client:
		customers, ok := a.clients.Lookup(caller)
		if !ok {
			return ctx, apierror.PermissionDenied(ReasonCallerNotAllowed,
				"caller "+caller.Subject+" is not a client of this service ("+a.clientsVar+")")
		}
		return ContextWithPrincipal(ctx, Principal{Caller: caller, Kind: KindClient, Customers: customers}), nil
	case Peer:
		if !slices.ContainsFunc(a.peers, caller.Is) {
			return ctx, apierror.PermissionDenied(ReasonCallerNotAllowed,
				"caller "+caller.Subject+" may not call "+method+" ("+a.peersVar+")")
		}
		return ContextWithPrincipal(ctx, Principal{Caller: caller, Kind: KindPeer}), nil
	}
	a.log.ErrorContext(ctx, "call refused: the method's authorization rule is invalid", "method", method, "rule", rule)
	return ctx, apierror.PermissionDenied(ReasonNoRule, "method "+method+" has no valid authorization rule")
}

// Unary enforces the policy on unary calls. Install it after
// authentication (server.WithAuthInterceptors does: after WithCallerAuth,
// before validation).
func (a *Authorizer) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream enforces the policy on streaming calls, so a streaming method is
// no way around it. Chain it after WithCallerAuth's (a
// grpc.ChainStreamInterceptor option given after it: server.WithGRPCOptions).
func (a *Authorizer) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &principalStream{ServerStream: ss, ctx: ctx})
	}
}

// ServerOptions are the options installing a on a pkg/server Server.
func (a *Authorizer) ServerOptions() []server.Option {
	return []server.Option{server.WithAuthInterceptors(a.Unary()),
		server.WithGRPCOptions(grpc.ChainStreamInterceptor(a.Stream()))}
}

type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *principalStream) Context() context.Context { return s.ctx }
