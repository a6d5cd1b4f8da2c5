package authz_test

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"

	"github.com/lossless-dev/lossless/pkg/authz"
	"github.com/lossless-dev/lossless/pkg/server"
)

// A service's policy is one table; the handler decides on the data with
// the principal the interceptor admitted.
func Example() {
	policy := authz.Infrastructure().Merge(authz.Policy{
		"/shop.v1.Orders/CreateOrder": authz.Client,
		"/shop.v1.Orders/GetOrder":    authz.Client,
	})
	clients, _ := authz.ParseClients("web-shop=cust-a|cust-b,load-generator=*")
	az, _ := authz.New(policy, authz.Config{Clients: clients}, slog.New(slog.DiscardHandler))
	// server.New(cfg, logger, server.WithCallerAuth(verifier), az.ServerOptions()...)

	create := func(ctx context.Context, customerID string) error {
		if !authz.MayActFor(ctx, customerID) {
			return authz.RefuseCustomer("order.customer_id", customerID)
		}
		return nil // write the order
	}
	ctx := server.ContextWithCaller(context.Background(), server.Caller{Subject: "web-shop"})
	_, err := az.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/shop.v1.Orders/CreateOrder"},
		func(ctx context.Context, _ any) (any, error) {
			fmt.Println("cust-a:", create(ctx, "cust-a") == nil)
			fmt.Println("cust-c:", create(ctx, "cust-c") == nil)
			return nil, nil
		})
	fmt.Println(err)
	_, err = az.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/shop.v1.Orders/DeleteOrder"},
		func(context.Context, any) (any, error) { return nil, nil })
	fmt.Println(err != nil)
	// Output:
	// cust-a: true
	// cust-c: false
	// <nil>
	// true
}
