package operator_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// inProcess are the operations over a database nothing listens on (the
// pool connects lazily) and no inbox or lease queue.
func inProcess(t *testing.T) operator.Operations {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ops, err := operator.NewInProcess(operator.Deps{DB: pool, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

// A service without an inbox or a lease queue answers their methods
// UNIMPLEMENTED before touching its database.
func TestRepairsOfAStoreTheServiceLacksAreUnimplemented(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ops := inProcess(t)
	authz := &opsv1.OperatorAuthorization{Ticket: "T-1", Actor: "ann"}
	for name, call := range map[string]func() error{
		"ListInboxEntries": func() error { _, err := ops.ListInboxEntries(ctx, &opsv1.ListInboxEntriesRequest{}); return err },
		"GetInboxEntry":    func() error { _, err := ops.GetInboxEntry(ctx, &opsv1.GetInboxEntryRequest{Id: 1}); return err },
		"ReplayInboxEntries": func() error {
			_, err := ops.ReplayInboxEntries(ctx, &opsv1.ReplayInboxEntriesRequest{Authorization: authz, Ids: []int64{1}})
			return err
		},
		"CleanupInbox": func() error {
			_, err := ops.CleanupInbox(ctx, &opsv1.CleanupInboxRequest{Authorization: authz, DryRun: true})
			return err
		},
		"ListJobs": func() error { _, err := ops.ListJobs(ctx, &opsv1.ListJobsRequest{}); return err },
		"RetryJobs": func() error {
			_, err := ops.RetryJobs(ctx, &opsv1.RetryJobsRequest{Authorization: authz, Ids: []int64{1}})
			return err
		},
	} {
		if status.Code(call()) != codes.Unimplemented {
			t.Errorf("%s: %v, want UNIMPLEMENTED", name, call())
		}
	}
}

// The command line knows every group and refuses what it cannot send
// before calling the API.
func TestCLIUsageErrors(t *testing.T) {
	t.Parallel()
	ops := inProcess(t)
	for _, args := range [][]string{
		{"inbox"}, {"inbox", "purge"}, {"jobs", "delete"},
		{"jobs", "retry", "--ticket", "T", "--actor", "A"},
		{"jobs", "retry", "--ids", "1,x", "--ticket", "T", "--actor", "A"},
		{"inbox", "show"},
		{"inbox", "replay", "--from", "yesterday", "--to", "2026-01-01T00:00:00Z", "--ticket", "T", "--actor", "A"},
		{"parked", "replay", "--consumer"},
	} {
		var out bytes.Buffer
		if err := operator.RunCLI(context.Background(), args, ops, "", &out); !errors.Is(err, operator.ErrUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
	var out bytes.Buffer
	_ = operator.RunCLI(context.Background(), []string{"help"}, ops, "", &out)
	for _, g := range operator.CLIGroups {
		if !strings.Contains(out.String(), "\n  "+g+" ") {
			t.Errorf("usage does not document the %s group:\n%s", g, out.String())
		}
	}
}
