package admin_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/pkg/apierror"
	pkgoperator "github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
	"github.com/lossless-dev/lossless/services/workorder/internal/receiver"
)

// With its database unreachable, the operator API (OperatorService and
// WorkOrderAdminService) answers as the public API
// does (apierror.Public through pkg/server): UNAVAILABLE with a retry hint,
// so a client or the console retries, and none of the driver's text (host,
// port, user, SQL) in the message.
func TestAdminDuringDatabaseOutageIsUnavailableWithoutDriverText(t *testing.T) {
	t.Parallel()
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://workorder_app:pw@127.0.0.1:%d/workorder?sslmode=disable", port))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg) // lazy: nothing listens on port
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	logger := slog.New(slog.DiscardHandler)
	ops, err := admin.NewOps(pool, logger)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := admin.NewService(ops, token, logger)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := invoicing.New(pool, invoicing.Config{}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	deps, err := admin.OperatorDeps(pool, inv, receiver.Config{}, nil, logger)
	if err != nil {
		t.Fatal(err)
	}
	deps.Token = token
	opsSvc, err := pkgoperator.NewService(deps)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, logger,
		server.WithAuthInterceptors(svc.AuthInterceptor(), opsSvc.AuthInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	workorderv1.RegisterWorkOrderAdminServiceServer(srv.GRPC(), svc)
	opsv1.RegisterOperatorServiceServer(srv.GRPC(), opsSvc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	cl, adminCl := opsv1.NewOperatorServiceClient(conn), workorderv1.NewWorkOrderAdminServiceClient(conn)
	authed := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))

	calls := map[string]func() error{
		"ListInboxEntries": func() error {
			_, err := cl.ListInboxEntries(authed, &opsv1.ListInboxEntriesRequest{})
			return err
		},
		"GetInboxEntry": func() error {
			_, err := cl.GetInboxEntry(authed, &opsv1.GetInboxEntryRequest{Id: 1})
			return err
		},
		"ReplayInboxEntries": func() error {
			_, err := cl.ReplayInboxEntries(authed, &opsv1.ReplayInboxEntriesRequest{Ids: []int64{1},
				Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-1", Actor: "hal"}})
			return err
		},
		"RecordReHandOff": func() error {
			_, err := adminCl.RecordReHandOff(authed, &workorderv1.RecordReHandOffRequest{WorkOrderId: "0b9d6f4e-6f1c-4a8e-9a57-3d1c2b7e8f90",
				Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-1", Actor: "hal"}})
			return err
		},
	}
	for name, call := range calls {
		err := call()
		if status.Code(err) != codes.Unavailable || apierror.RetryAfter(err) <= 0 {
			t.Errorf("%s with the database down: %v (retry after %v), want UNAVAILABLE with a retry hint",
				name, err, apierror.RetryAfter(err))
			continue
		}
		msg := status.Convert(err).Message()
		for _, leak := range []string{"127.0.0.1", fmt.Sprint(port), "workorder_app", "dial", "connect", "SELECT", "SQLSTATE"} {
			if strings.Contains(msg, leak) {
				t.Errorf("%s: message leaks %q: %s", name, leak, msg)
			}
		}
	}
}
