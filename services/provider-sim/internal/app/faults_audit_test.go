package app_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/pkg/apierror"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/app"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
)

// auditRows reads the simulator's operator_audit, newest first, as the
// runtime role.
func (b *bundle) auditRows(t *testing.T) []operator.AuditRecord {
	t.Helper()
	rs, _, err := operator.ListAudit(context.Background(), b.pool, operator.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// knob is one knob of a row's params, before or after.
func knob(r operator.AuditRecord, when, field string) any {
	m, _ := r.Params[when].(map[string]any)
	return m[field]
}

// A change of the knobs without an authorization (ticket and actor) is
// INVALID_ARGUMENT naming the field, over gRPC and REST, and changes
// nothing: no knob, no row. With one, the change is in force and recorded:
// one operator_audit row with the actor, the ticket and the knobs before
// and after, the seed drawn from the clock included.
func TestAFaultChangeNeedsAnAuthorizationAndIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Millisecond)
	admin := providerv1.NewProviderAdminServiceClient(b.admin)
	ctx := operatorContext(operatorToken)
	crash := &providerv1.Faults{PublishThenCrash: 1}
	before := b.faultsInForce(t)

	for name, c := range map[string]struct {
		auth  *opsv1.OperatorAuthorization
		field string
	}{
		"no authorization": {nil, "authorization"},
		"no ticket":        {&opsv1.OperatorAuthorization{Actor: "alice"}, "authorization.ticket"},
		// Passes the proto rule (min_len 1); the service's own check trims.
		"blank actor": {&opsv1.OperatorAuthorization{Ticket: "INC-7", Actor: " \t"}, "authorization.actor"},
	} {
		_, err := admin.UpdateFaults(ctx, &providerv1.UpdateFaultsRequest{Faults: crash, Authorization: c.auth})
		if status.Code(err) != codes.InvalidArgument || !slices.Contains(violations(err), c.field) {
			t.Errorf("gRPC, %s: %v (fields %v), want INVALID_ARGUMENT naming %s", name, err, violations(err), c.field)
		}
	}
	for query, field := range map[string]string{
		"":                            "authorization",
		"?authorization.actor=alice":  "authorization.ticket",
		"?authorization.ticket=INC-7": "authorization.actor",
		"?authorization.ticket=%20&authorization.actor=alice": "authorization.ticket",
	} {
		r := b.adminHTTP(t, http.MethodPut, "/v1/faults"+query, `{"publishThenCrash": 1}`, "Bearer "+operatorToken)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, `"`+field+`"`) {
			t.Errorf("PUT /v1/faults%s: HTTP %d %s, want 400 naming %s", query, r.status, r.body, field)
		}
	}
	if got := b.faultsInForce(t); got != before {
		t.Fatalf("knobs changed by refused requests:\n%s\nwas\n%s", got, before)
	}
	if rs := b.auditRows(t); len(rs) != 0 {
		t.Fatalf("refused requests recorded: %+v", rs)
	}

	if _, err := admin.UpdateFaults(ctx, &providerv1.UpdateFaultsRequest{Faults: &providerv1.Faults{Duplicate: 0.25, Seed: 9},
		Authorization: &opsv1.OperatorAuthorization{Ticket: " INC-7 ", Actor: "alice"}}); err != nil {
		t.Fatal(err)
	}
	r := b.adminHTTP(t, http.MethodPut, "/v1/faults?authorization.ticket=INC-8&authorization.actor=bob", `{"poison": 0.5}`, "Bearer "+operatorToken)
	if r.status != http.StatusOK {
		t.Fatalf("PUT with an authorization: HTTP %d %s", r.status, r.body)
	}
	inForce := b.faultsInForce(t)
	if !strings.Contains(inForce, `"poison":0.5`) || !strings.Contains(inForce, `"duplicate":0,`) {
		t.Fatalf("knobs in force: %s", inForce)
	}

	rs := b.auditRows(t)
	if len(rs) != 2 {
		t.Fatalf("%d rows, want 2: %+v", len(rs), rs)
	}
	second, first := rs[0], rs[1]
	if first.Action != "faults.update" || first.Actor != "break-glass" || first.Params["stated_actor"] != "alice" || first.Ticket != "INC-7" || first.Affected != 1 || first.DryRun {
		t.Fatalf("first row: %+v", first)
	}
	if knob(first, "before", "duplicate") != float64(0) || knob(first, "after", "duplicate") != 0.25 || knob(first, "after", "seed") != "9" {
		t.Fatalf("first row's knobs: %v", first.Params)
	}
	if second.Actor != "break-glass" || second.Params["stated_actor"] != "bob" || second.Ticket != "INC-8" ||
		knob(second, "before", "duplicate") != 0.25 || knob(second, "after", "duplicate") != float64(0) || knob(second, "after", "poison") != 0.5 {
		t.Fatalf("second row: %+v", second)
	}
	// Seed 0 is drawn from the clock before the row is written: the row
	// holds the seed in force, as GET /v1/faults reports it (an int64, a
	// string in JSON).
	seed, _ := knob(second, "after", "seed").(string)
	if seed == "" || seed == "0" || !strings.Contains(inForce, fmt.Sprintf(`"seed":%q`, seed)) {
		t.Fatalf("recorded seed %q, in force %s", seed, inForce)
	}
	if second.Params["incarnation"] != "1" {
		t.Fatalf("row's stream: %v", second.Params)
	}
}

// The rows are read through the OperatorService the simulator mounts:
// ListOperatorAudit with the operator token, newest first and filtered like
// every service's; without the token it is refused. The simulator has no
// outbox or consumers: those methods are UNIMPLEMENTED, not empty answers.
func TestFaultChangesAreListedThroughOperatorService(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Millisecond)
	admin := providerv1.NewProviderAdminServiceClient(b.admin)
	ops := opsv1.NewOperatorServiceClient(b.admin)
	ctx := operatorContext(operatorToken)
	for _, a := range []*opsv1.OperatorAuthorization{{Ticket: "INC-1", Actor: "alice"}, {Ticket: "INC-2", Actor: "bob"}} {
		if _, err := admin.UpdateFaults(ctx, &providerv1.UpdateFaultsRequest{Faults: &providerv1.Faults{Seed: 1}, Authorization: a}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := ops.ListOperatorAudit(ctx, &opsv1.ListOperatorAuditRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range resp.GetRecords() {
		got = append(got, r.GetAction()+" "+r.GetActor()+" "+r.GetTicket())
	}
	// The operator token is break-glass: the requests' actors are only stated.
	if strings.Join(got, ", ") != "faults.update break-glass INC-2, faults.update break-glass INC-1" {
		t.Fatalf("ListOperatorAudit: %v", got)
	}
	if resp, err := ops.ListOperatorAudit(ctx, &opsv1.ListOperatorAuditRequest{Actor: "break-glass", Ticket: "INC-1"}); err != nil || len(resp.GetRecords()) != 1 ||
		resp.GetRecords()[0].GetParams().GetFields()["stated_actor"].GetStringValue() != "alice" {
		t.Fatalf("filtered by actor: %v %v", resp, err)
	}
	if _, err := ops.ListOperatorAudit(context.Background(), &opsv1.ListOperatorAuditRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without the token: %v, want UNAUTHENTICATED", err)
	}
	if _, err := ops.ListOutboxEvents(ctx, &opsv1.ListOutboxEventsRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("ListOutboxEvents: %v, want UNIMPLEMENTED", err)
	}
}

// With the database unreachable a change cannot be recorded, so it is not
// made: UNAVAILABLE with a retry hint, and the knobs in force stay as they
// were. Reading them needs no database.
func TestAFaultChangeIsNotMadeWhenItCannotBeRecorded(t *testing.T) {
	t.Parallel()
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	cfg := app.Config{
		// Nothing listens there: every connection is refused.
		DatabaseURL: fmt.Sprintf("postgres://provider@127.0.0.1:%d/providersim?sslmode=disable", port),
		Server: server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminGRPCAddr: "127.0.0.1:0", AdminHTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second,
			Role: server.RoleAPI},
		PubSub:        pubsub.ClientConfig{ProjectID: emu.ProjectID, EmulatorHost: emu.Addr},
		Engine:        engine.Config{Workers: 1},
		OperatorToken: operatorToken,
		Auth:          libenv.CallerAuth{Disabled: true}, // caller authentication: tested apart
	}
	a, err := app.New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), telemetry.Providers{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	conn, err := grpc.NewClient(a.AdminGRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	admin := providerv1.NewProviderAdminServiceClient(conn)
	var before *providerv1.Faults
	waitfor.Condition(t, 5*time.Second, "GetFaults answers", func() bool {
		resp, err := admin.GetFaults(context.Background(), &providerv1.GetFaultsRequest{})
		before = resp.GetFaults()
		return err == nil
	})

	_, err = admin.UpdateFaults(operatorContext(operatorToken), &providerv1.UpdateFaultsRequest{
		Faults: &providerv1.Faults{PublishThenCrash: 1, Seed: 3}, Authorization: opAuth})
	if status.Code(err) != codes.Unavailable || apierror.RetryAfter(err) == 0 {
		t.Fatalf("UpdateFaults without its database: %v, want UNAVAILABLE with a retry hint", err)
	}
	resp, err := admin.GetFaults(context.Background(), &providerv1.GetFaultsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetFaults().GetPublishThenCrash() != 0 || resp.GetFaults().GetSeed() != before.GetSeed() {
		t.Fatalf("knobs after the unrecorded change: %v, were %v", resp.GetFaults(), before)
	}
}
