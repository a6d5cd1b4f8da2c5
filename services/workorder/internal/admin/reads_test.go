package admin_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/workorder/internal/handoff"
	"github.com/lossless-dev/lossless/services/workorder/internal/orders"
)

// serveGRPC serves what register registers as production does (pkg/server:
// auth first, then request validation) and returns a connection to it.
func serveGRPC(t *testing.T, auth grpc.UnaryServerInterceptor, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, logger,
		server.WithAuthInterceptors(auth))
	if err != nil {
		t.Fatal(err)
	}
	register(srv.GRPC())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server shutdown: %v", err)
		}
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// asOperator is a context carrying the operator token.
func asOperator() context.Context {
	return metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
}

// violations returns the BadRequest field names of an INVALID_ARGUMENT.
func violations(t *testing.T, err error) []string {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("got %v, want INVALID_ARGUMENT", err)
	}
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	return fields
}

func wantViolation(t *testing.T, what string, err error, field string) {
	t.Helper()
	if got := violations(t, err); len(got) != 1 || got[0] != field {
		t.Errorf("%s: violations %v, want [%s]", what, got, field)
	}
}

// createOrders creates n orders through the repository, each with its
// hand-off event in the outbox, and returns their ids in creation order.
func createOrders(t *testing.T, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, repo *orders.Repository, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for range n {
		o, err := orders.New("c-1", "fit pipes", 2, orders.Money{CurrencyCode: "EUR", MinorUnits: 100})
		if err != nil {
			t.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := orders.InTx(tx).Create(ctx, o); return err }); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, o.ID.String())
	}
	return ids
}

// The outbox as the relay left it: one hand-off published, one FAILED
// (permanent error), one backing off after a transient error, one not yet
// tried; listed by state, aggregate and type, paged, and refused when the
// request is invalid or unauthenticated.
func TestListOutboxEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	repo, err := orders.NewRepository(b.pool)
	if err != nil {
		t.Fatal(err)
	}
	ids := createOrders(t, b.pool, repo, 3)
	outcome := map[string]error{ids[0]: nil, ids[1]: retry.Permanent(errors.New("provider refused the order")),
		ids[2]: errors.New("provider timed out")}
	relay, err := outbox.NewRelay(b.pool, map[string]outbox.Dispatcher{
		handoff.EventType: outbox.DispatcherFunc(func(_ context.Context, ev outbox.Event) (outbox.Commit, error) {
			return nil, outcome[ev.AggregateID]
		}),
	}, outbox.Config{BackoffBase: time.Hour, BackoffMax: time.Hour}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.ProcessBatch(context.Background()); err != nil {
		t.Fatal(err)
	}
	untried := createOrders(t, b.pool, repo, 1)[0]

	cl := servedOps(t, b, nil)
	ctx := asOperator()
	list := func(req *opsv1.ListOutboxEventsRequest) *opsv1.ListOutboxEventsResponse {
		t.Helper()
		resp, err := cl.ListOutboxEvents(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	aggregates := func(evs []*opsv1.OutboxEvent) []string {
		var out []string
		for _, e := range evs {
			out = append(out, e.GetAggregateId()+"/"+e.GetState())
		}
		return out
	}

	// Default: the undelivered, in claim order.
	resp := list(&opsv1.ListOutboxEventsRequest{})
	want := []string{ids[1] + "/FAILED", ids[2] + "/PENDING", untried + "/PENDING"}
	if got := aggregates(resp.GetEvents()); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || resp.GetNextPageToken() != "" {
		t.Fatalf("undelivered: %v, want %v", got, want)
	}
	failed, backingOff, fresh := resp.GetEvents()[0], resp.GetEvents()[1], resp.GetEvents()[2]
	if failed.GetAttempts() != 1 || failed.GetLastError() != "permanent: provider refused the order" ||
		failed.GetEventType() != handoff.EventType || failed.GetAggregateType() != orders.AggregateType || failed.GetPublishTime() != nil {
		t.Errorf("failed event: %v", failed)
	}
	if backingOff.GetAttempts() != 1 || backingOff.GetLastError() != "provider timed out" ||
		!backingOff.GetNextAttemptTime().AsTime().After(time.Now()) {
		t.Errorf("backing-off event: %v, want attempt 1 and the next in the future (jittered backoff of up to an hour)", backingOff)
	}
	if fresh.GetAttempts() != 0 || fresh.GetLastError() != "" || fresh.GetNextAttemptTime() != nil || fresh.GetCreateTime() == nil ||
		fresh.GetEventId() == "" || fresh.GetSequence() <= backingOff.GetSequence() {
		t.Errorf("untried event: %v", fresh)
	}

	pub := list(&opsv1.ListOutboxEventsRequest{States: []string{"PUBLISHED"}}).GetEvents()
	if len(pub) != 1 || pub[0].GetAggregateId() != ids[0] || pub[0].GetPublishTime() == nil || pub[0].GetAttempts() != 1 {
		t.Fatalf("published: %v", pub)
	}
	one := list(&opsv1.ListOutboxEventsRequest{States: []string{"PUBLISHED", "FAILED", "PENDING"}, AggregateId: ids[2]}).GetEvents()
	if len(one) != 1 || one[0].GetAggregateId() != ids[2] {
		t.Fatalf("by aggregate: %v", one)
	}
	if got := list(&opsv1.ListOutboxEventsRequest{EventType: "lossless.events.v1.Other"}).GetEvents(); len(got) != 0 {
		t.Fatalf("by another type: %v", got)
	}

	// Paging across pages: every state, two per page.
	all := []string{"PENDING", "PUBLISHED", "FAILED"}
	var seen []string
	req := &opsv1.ListOutboxEventsRequest{States: all, PageSize: 2}
	for page := 0; ; page++ {
		if page > 2 {
			t.Fatal("paging does not end")
		}
		resp := list(req)
		seen = append(seen, aggregates(resp.GetEvents())...)
		if resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
		req.States = []string{"FAILED", "PUBLISHED", "PENDING"} // the same set: the token still applies
	}
	if len(seen) != 4 || seen[0] != ids[0]+"/PUBLISHED" || seen[3] != untried+"/PENDING" {
		t.Fatalf("paged: %v", seen)
	}

	// Invalid arguments: one field violation each.
	token := list(&opsv1.ListOutboxEventsRequest{States: all, PageSize: 1}).GetNextPageToken()
	for name, c := range map[string]struct {
		req   *opsv1.ListOutboxEventsRequest
		field string
	}{
		"unknown state":    {&opsv1.ListOutboxEventsRequest{States: []string{"PUBLISHING"}}, "states[0]"},
		"repeated state":   {&opsv1.ListOutboxEventsRequest{States: []string{"FAILED", "FAILED"}}, "states"},
		"page too large":   {&opsv1.ListOutboxEventsRequest{PageSize: 501}, "page_size"},
		"negative page":    {&opsv1.ListOutboxEventsRequest{PageSize: -1}, "page_size"},
		"NUL in aggregate": {&opsv1.ListOutboxEventsRequest{AggregateId: "a\x00"}, "aggregate_id"},
		"malformed token":  {&opsv1.ListOutboxEventsRequest{PageToken: "not-a-token"}, "page_token"},
		"foreign token":    {&opsv1.ListOutboxEventsRequest{States: []string{"FAILED"}, PageToken: token}, "page_token"},
	} {
		_, err := cl.ListOutboxEvents(ctx, c.req)
		wantViolation(t, name, err, c.field)
	}

	if _, err := cl.ListOutboxEvents(context.Background(), &opsv1.ListOutboxEventsRequest{PageSize: -1}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no token: %v, want UNAUTHENTICATED (before validation)", err)
	}
}

// Operator actions taken through the API land in operator_audit and come
// back newest first, filtered and paged.
func TestListOperatorAudit(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.parked(t)
	ocl := servedOps(t, b, nil)
	cl := ocl
	ctx := asOperator()
	as := func(ticket, actor string) *opsv1.OperatorAuthorization {
		return &opsv1.OperatorAuthorization{Ticket: ticket, Actor: actor}
	}
	if _, err := cl.ReplayInboxEntries(ctx, &opsv1.ReplayInboxEntriesRequest{Authorization: as("INC-1", "alice"), Ids: []int64{1}, DryRun: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CleanupInbox(ctx, &opsv1.CleanupInboxRequest{Authorization: as("INC-2", "bob"), DryRun: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ReplayInboxEntries(ctx, &opsv1.ReplayInboxEntriesRequest{Authorization: as("INC-3", "alice"), Ids: []int64{1}}); err != nil {
		t.Fatal(err)
	}

	list := func(req *opsv1.ListOperatorAuditRequest) *opsv1.ListOperatorAuditResponse {
		t.Helper()
		resp, err := ocl.ListOperatorAudit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	tickets := func(rs []*opsv1.OperatorAuditRecord) (out []string) {
		for _, r := range rs {
			out = append(out, r.GetTicket())
		}
		return out
	}
	all := list(&opsv1.ListOperatorAuditRequest{}).GetRecords()
	if got := tickets(all); len(got) != 3 || got[0] != "INC-3" || got[1] != "INC-2" || got[2] != "INC-1" {
		t.Fatalf("newest first: %v", got)
	}
	if r := all[0]; r.GetActor() != "break-glass" || r.GetDryRun() || r.GetAffected() != 1 || r.GetOccurTime() == nil ||
		r.GetAction() == "" || r.GetParams() == nil || len(r.GetParams().GetFields()) == 0 {
		t.Errorf("replay record: %v", r)
	}
	if r := all[2]; !r.GetDryRun() || r.GetActor() != "break-glass" {
		t.Errorf("dry-run record: %v", r)
	}
	if got := tickets(list(&opsv1.ListOperatorAuditRequest{Actor: "break-glass"}).GetRecords()); len(got) != 3 || got[0] != "INC-3" || got[2] != "INC-1" {
		t.Errorf("by actor: %v", got)
	}
	if got := tickets(list(&opsv1.ListOperatorAuditRequest{Ticket: "INC-2"}).GetRecords()); len(got) != 1 || got[0] != "INC-2" {
		t.Errorf("by ticket: %v", got)
	}
	if got := list(&opsv1.ListOperatorAuditRequest{Action: all[1].GetAction()}).GetRecords(); len(got) != 1 || got[0].GetTicket() != "INC-2" {
		t.Errorf("by action %q: %v", all[1].GetAction(), tickets(got))
	}

	// Paging: one per page, the same three in the same order.
	var seen []string
	req := &opsv1.ListOperatorAuditRequest{PageSize: 1}
	for page := 0; ; page++ {
		if page > 3 {
			t.Fatal("paging does not end")
		}
		resp := list(req)
		seen = append(seen, tickets(resp.GetRecords())...)
		if resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
	}
	if len(seen) != 3 || seen[0] != "INC-3" || seen[2] != "INC-1" {
		t.Fatalf("paged: %v", seen)
	}

	token := list(&opsv1.ListOperatorAuditRequest{PageSize: 1}).GetNextPageToken()
	for name, c := range map[string]struct {
		req   *opsv1.ListOperatorAuditRequest
		field string
	}{
		"page too large":  {&opsv1.ListOperatorAuditRequest{PageSize: 501}, "page_size"},
		"NUL in actor":    {&opsv1.ListOperatorAuditRequest{Actor: "\x00"}, "actor"},
		"malformed token": {&opsv1.ListOperatorAuditRequest{PageToken: "%%%"}, "page_token"},
		"foreign token":   {&opsv1.ListOperatorAuditRequest{Actor: "bob", PageToken: token}, "page_token"},
		"token of no row": {&opsv1.ListOperatorAuditRequest{PageToken: zeroToken(t)}, "page_token"},
		"action too long": {&opsv1.ListOperatorAuditRequest{Action: string(make([]byte, 201))}, "action"},
	} {
		_, err := ocl.ListOperatorAudit(ctx, c.req)
		wantViolation(t, name, err, c.field)
	}
	if _, err := ocl.ListOperatorAudit(context.Background(), &opsv1.ListOperatorAuditRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no token: %v, want UNAUTHENTICATED", err)
	}
	// Reading audits nothing.
	if n := b.count(t, `SELECT count(*) FROM operator_audit`); n != 3 {
		t.Errorf("audit rows after the reads: %d, want 3", n)
	}
}

// zeroToken is a well-formed token for the unfiltered listing whose
// position no row has.
func zeroToken(t *testing.T) string {
	t.Helper()
	return operator.EncodePageToken(0, "", "", "")
}
