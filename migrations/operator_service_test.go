// OperatorService (pkg/operator) on billing's real schema (outbox,
// parked_messages, operator_audit from its migrations).
package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/server"
)

const (
	opsToken = "0123456789abcdef0123456789abcdef-operator-service"
	demoSub  = "demo.events"
)

// fixture is a service database (billing's schema: an outbox,
// parked_messages and operator_audit) with two outbox events, one FAILED
// and one PUBLISHED, and one parked message of consumer demo, whose replay
// is refused while refuse is set.
type fixture struct {
	pool              *pgxpool.Pool
	failed, published string
	parkedID          int64
	refuse            *bool
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	ctx := context.Background()
	f := fixture{pool: pgtest.NewPool(t, migrations.Billing()...), refuse: new(bool)}
	orders := []string{uuid.NewString(), uuid.NewString()}
	var eventType string
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		for _, o := range orders {
			ev, err := outbox.NewEvent(ctx, "demo", o, wrapperspb.String(o))
			if err != nil {
				return err
			}
			eventType = ev.Type
			if err := outbox.Append(ctx, tx, ev); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(f.pool, map[string]outbox.Dispatcher{
		eventType: outbox.DispatcherFunc(func(_ context.Context, ev outbox.Event) (outbox.Commit, error) {
			if ev.AggregateID == orders[1] {
				return nil, retry.Permanent(errors.New("downstream refuses the message"))
			}
			return nil, nil
		}),
	}, outbox.Config{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.ProcessBatch(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.QueryRow(ctx, `SELECT event_id FROM outbox_events WHERE aggregate_id = $1`, orders[1]).Scan(&f.failed); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.QueryRow(ctx, `SELECT event_id FROM outbox_events WHERE aggregate_id = $1`, orders[0]).Scan(&f.published); err != nil {
		t.Fatal(err)
	}
	store, err := parked.New()
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Park(ctx, f.pool, parked.Message{Subscription: demoSub, MessageID: "m-1", EventID: "e-1", EventType: "demo.Event",
		Subject: orders[1], Data: []byte("x"), Reason: "unknown order"})
	if err != nil || st.ID == 0 {
		t.Fatalf("park: %v %v", st, err)
	}
	f.parkedID = st.ID
	return f
}

// serve mounts OperatorService over f as a service does (pkg/server: the
// token first, then request validation), with token, and returns a client.
func (f fixture) serve(t *testing.T, token string) opsv1.OperatorServiceClient {
	t.Helper()
	svc := f.service(t, token)
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler),
		server.WithAuthInterceptors(svc.AuthInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	opsv1.RegisterOperatorServiceServer(srv.GRPC(), svc)
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
	return opsv1.NewOperatorServiceClient(conn)
}

// service is OperatorService over f with token, consumer demo.
func (f fixture) service(t *testing.T, token string) *operator.Service {
	t.Helper()
	svc, err := operator.NewService(f.deps(t, token))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// inProcess is the operations over f for the command line, consumer demo.
func (f fixture) inProcess(t *testing.T) operator.Operations {
	t.Helper()
	ops, err := operator.NewInProcess(f.deps(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

func (f fixture) deps(t *testing.T, token string) operator.Deps {
	t.Helper()
	store, err := parked.New()
	if err != nil {
		t.Fatal(err)
	}
	return operator.Deps{DB: f.pool, Token: token, TokenEnv: "DEMO_OPERATOR_TOKEN", Parked: store,
		Logger: slog.New(slog.DiscardHandler), Consumers: []operator.Consumer{{Name: "demo",
			Replay: func(ctx context.Context, tx pgx.Tx, id int64, ticket, actor string) (string, error) {
				err := store.Replay(ctx, tx, id, ticket, actor, func(context.Context, pgx.Tx, parked.Parked) error {
					if *f.refuse {
						return fmt.Errorf("%w: the order is still unknown", operator.ErrStillRefused)
					}
					return nil
				})
				return "applied", err
			}}}}
}

func (f fixture) count(t *testing.T, q string, args ...any) (n int) {
	t.Helper()
	if err := f.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// unchanged fails unless the FAILED event is FAILED, the parked message
// open and operator_audit empty.
func (f fixture) unchanged(t *testing.T, when string) {
	t.Helper()
	if n := f.count(t, `SELECT count(*) FROM outbox_events WHERE event_id = $1 AND status = 'FAILED'`, f.failed) +
		f.count(t, `SELECT count(*) FROM parked_messages WHERE id = $1 AND replayed_at IS NULL`, f.parkedID) -
		f.count(t, `SELECT count(*) FROM operator_audit`); n != 2 {
		t.Fatalf("%s: something changed", when)
	}
}

func withToken(tok string) context.Context {
	return metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
}

var demoAuth = &opsv1.OperatorAuthorization{Ticket: "INC-21", Actor: "frank"}

// Every RPC is refused without the token (UNAUTHENTICATED), with a wrong
// one (PERMISSION_DENIED) and, when the service has no token, with any;
// nothing is changed or audited, and the token is checked before the
// request is validated.
func TestService_RefusesWithoutTheToken_ChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cl := f.serve(t, opsToken)
	disabled := f.serve(t, "")
	calls := map[string]func(opsv1.OperatorServiceClient, context.Context) error{
		"ListOutboxEvents": func(c opsv1.OperatorServiceClient, ctx context.Context) error {
			_, err := c.ListOutboxEvents(ctx, &opsv1.ListOutboxEventsRequest{})
			return err
		},
		"RequeueOutboxEvents": func(c opsv1.OperatorServiceClient, ctx context.Context) error {
			_, err := c.RequeueOutboxEvents(ctx, &opsv1.RequeueOutboxEventsRequest{Authorization: demoAuth, EventIds: []string{f.failed}})
			return err
		},
		"RequeueOutboxEvents invalid": func(c opsv1.OperatorServiceClient, ctx context.Context) error {
			_, err := c.RequeueOutboxEvents(ctx, &opsv1.RequeueOutboxEventsRequest{})
			return err
		},
		"ListParkedMessages": func(c opsv1.OperatorServiceClient, ctx context.Context) error {
			_, err := c.ListParkedMessages(ctx, &opsv1.ListParkedMessagesRequest{})
			return err
		},
		"ReplayParkedMessage": func(c opsv1.OperatorServiceClient, ctx context.Context) error {
			_, err := c.ReplayParkedMessage(ctx, &opsv1.ReplayParkedMessageRequest{Authorization: demoAuth, Id: f.parkedID})
			return err
		},
		"ReplayDeadLetters": func(c opsv1.OperatorServiceClient, ctx context.Context) error {
			_, err := c.ReplayDeadLetters(ctx, &opsv1.ReplayDeadLettersRequest{Authorization: demoAuth, MaxMessages: 1})
			return err
		},
		"ListOperatorAudit": func(c opsv1.OperatorServiceClient, ctx context.Context) error {
			_, err := c.ListOperatorAudit(ctx, &opsv1.ListOperatorAuditRequest{})
			return err
		},
	}
	for name, call := range calls {
		if err := call(cl, context.Background()); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s without a token: %v, want UNAUTHENTICATED", name, err)
		}
		if err := call(cl, withToken("not-the-token")); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s with a wrong token: %v, want PERMISSION_DENIED", name, err)
		}
		if err := call(disabled, withToken(opsToken)); status.Code(err) == codes.OK || status.Code(err) == codes.InvalidArgument {
			t.Errorf("%s on a service without a token: %v, want refused", name, err)
		}
	}
	f.unchanged(t, "after refused calls")
}

// A requeue over gRPC: refused when incomplete (nothing changed, nothing
// audited); the dry run names the FAILED event, skips the published one
// and changes nothing but its audit row; the requeue makes the event
// PENDING with a fresh budget once; the audit rows say who, why, what.
func TestService_RequeueOutboxEvents_DryRunThenOnceAudited(t *testing.T) {
	t.Parallel()
	ctx := withToken(opsToken)
	f := newFixture(t)
	cl := f.serve(t, opsToken)
	list, err := cl.ListOutboxEvents(ctx, &opsv1.ListOutboxEventsRequest{States: []string{"FAILED"}})
	if err != nil || len(list.GetEvents()) != 1 || list.GetEvents()[0].GetEventId() != f.failed ||
		list.GetEvents()[0].GetLastError() != "permanent: downstream refuses the message" || list.GetEvents()[0].GetAttempts() != 1 {
		t.Fatalf("FAILED events: %v %v", list, err)
	}
	for name, req := range map[string]*opsv1.RequeueOutboxEventsRequest{
		"no authorization": {EventIds: []string{f.failed}},
		"no actor":         {Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-21"}, EventIds: []string{f.failed}},
		"no ids":           {Authorization: demoAuth},
		"not a uuid":       {Authorization: demoAuth, EventIds: []string{"42"}},
	} {
		if _, err := cl.RequeueOutboxEvents(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
		}
	}
	f.unchanged(t, "after invalid requeues")

	dry, err := cl.RequeueOutboxEvents(ctx, &opsv1.RequeueOutboxEventsRequest{Authorization: demoAuth,
		EventIds: []string{f.failed, f.published}, DryRun: true})
	if err != nil || !dry.GetDryRun() || len(dry.GetEventIds()) != 1 || dry.GetEventIds()[0] != f.failed ||
		len(dry.GetSkipped()) != 1 || dry.GetSkipped()[0].GetState() != "PUBLISHED" {
		t.Fatalf("dry run: %v %v", dry, err)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox_events WHERE event_id = $1 AND status = 'FAILED' AND attempts = 1`, f.failed); n != 1 {
		t.Fatal("the dry run changed the event")
	}
	if _, err := cl.RequeueOutboxEvents(ctx, &opsv1.RequeueOutboxEventsRequest{Authorization: demoAuth, EventIds: []string{f.failed}}); err != nil {
		t.Fatal(err)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox_events WHERE event_id = $1 AND status = 'PENDING' AND attempts = 0
		AND last_error LIKE 'requeued by break-glass, ticket INC-21; was: %'`, f.failed); n != 1 {
		t.Fatal("the requeued event is not PENDING with a fresh budget")
	}
	again, err := cl.RequeueOutboxEvents(ctx, &opsv1.RequeueOutboxEventsRequest{Authorization: demoAuth, EventIds: []string{f.failed}})
	if err != nil || len(again.GetEventIds()) != 0 || again.GetSkipped()[0].GetState() != "PENDING" {
		t.Fatalf("second requeue: %v %v, want nothing requeued", again, err)
	}
	audit, err := cl.ListOperatorAudit(ctx, &opsv1.ListOperatorAuditRequest{Action: "outbox.requeue", Ticket: "INC-21"})
	if err != nil {
		t.Fatal(err)
	}
	recs := audit.GetRecords()
	if len(recs) != 3 || recs[0].GetAffected() != 0 || recs[1].GetAffected() != 1 || recs[1].GetDryRun() || !recs[2].GetDryRun() ||
		recs[2].GetAffected() != 1 || recs[1].GetActor() != operator.BreakGlass {
		t.Fatalf("audit, newest first: %v", recs)
	}
	if got := recs[1].GetParams().AsMap()["requeued"]; fmt.Sprint(got) != "["+f.failed+"]" {
		t.Fatalf("the requeue's audit params name %v, want [%s]", got, f.failed)
	}
}

// A parked message replayed over gRPC through its consumer: refused while
// the cause persists (nothing changed, nothing audited) and for an unknown
// consumer; the dry run reports the outcome and leaves the row open; the
// replay closes it once, by the actor under the ticket; both are audited as
// demo.replay-parked.
func TestService_ReplayParkedMessage_DryRunThenOnceAudited(t *testing.T) {
	t.Parallel()
	ctx := withToken(opsToken)
	f := newFixture(t)
	cl := f.serve(t, opsToken)
	list, err := cl.ListParkedMessages(ctx, &opsv1.ListParkedMessagesRequest{Subscription: demoSub})
	if err != nil || len(list.GetMessages()) != 1 || list.GetMessages()[0].GetId() != f.parkedID ||
		list.GetMessages()[0].GetReason() != "unknown order" || list.GetMessages()[0].GetMessageId() != "m-1" {
		t.Fatalf("parked: %v %v", list, err)
	}
	*f.refuse = true
	if _, err := cl.ReplayParkedMessage(ctx, &opsv1.ReplayParkedMessageRequest{Authorization: demoAuth, Id: f.parkedID}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("replay while the cause persists: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := cl.ReplayParkedMessage(ctx, &opsv1.ReplayParkedMessageRequest{Authorization: demoAuth, Id: f.parkedID, Consumer: "other"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("replay through an unknown consumer: %v, want INVALID_ARGUMENT", err)
	}
	f.unchanged(t, "after refused replays")

	*f.refuse = false
	dry, err := cl.ReplayParkedMessage(ctx, &opsv1.ReplayParkedMessageRequest{Authorization: demoAuth, Id: f.parkedID, DryRun: true})
	if err != nil || dry.GetOutcome() != "applied" || !dry.GetDryRun() {
		t.Fatalf("dry run: %v %v", dry, err)
	}
	if n := f.count(t, `SELECT count(*) FROM parked_messages WHERE replayed_at IS NULL`); n != 1 {
		t.Fatal("the dry run closed the parked message")
	}
	if _, err := cl.ReplayParkedMessage(ctx, &opsv1.ReplayParkedMessageRequest{Authorization: demoAuth, Id: f.parkedID, Consumer: "demo"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ReplayParkedMessage(ctx, &opsv1.ReplayParkedMessageRequest{Authorization: demoAuth, Id: f.parkedID}); status.Code(err) != codes.NotFound {
		t.Fatalf("second replay: %v, want NOT_FOUND", err)
	}
	if n := f.count(t, `SELECT count(*) FROM parked_messages WHERE id = $1 AND replayed_by = 'break-glass' AND ticket = 'INC-21'`, f.parkedID); n != 1 {
		t.Fatal("the parked message is not closed by the actor under the ticket")
	}
	if left, err := cl.ListParkedMessages(ctx, &opsv1.ListParkedMessagesRequest{}); err != nil || len(left.GetMessages()) != 0 {
		t.Fatalf("replayed message still listed: %v %v", left, err)
	}
	if n := f.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'demo.replay-parked' AND ticket = 'INC-21' AND actor = 'break-glass'
		AND affected = 1 AND (params->>'parked_id')::bigint = $1 AND params->>'outcome' = 'applied'`, f.parkedID); n != 2 {
		t.Fatalf("audit rows = %d, want the dry run's and the replay's", n)
	}
}

// idTokens stands in for the service's ID-token verifier: a token is the
// caller it names.
type idTokens map[string]server.Caller

func (i idTokens) Authenticate(_ context.Context, tok string) (server.Caller, error) {
	if c, ok := i[tok]; ok {
		return c, nil
	}
	return server.Caller{}, errors.New("token signature invalid")
}

// The audit records who the guard verified, never the request's actor:
// break-glass for the operator token, alice for her ID token, the console
// acting for bob as console:<console>/bob; the stated actor ("mallory") is
// kept as such in the params.
func TestService_AuditRecordsTheVerifiedOperator(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	deps := f.deps(t, opsToken)
	deps.Guard = []operator.GuardOption{operator.WithIdentities(operator.Identities{
		Auth:      idTokens{"alice-id": {Subject: "1001", Email: "alice@example.com"}, "console-id": {Subject: "console-client"}},
		Operators: []string{"alice@example.com"}, Consoles: []string{"console-client"},
	})}
	svc, err := operator.NewService(deps)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler),
		server.WithAuthInterceptors(svc.AuthInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	opsv1.RegisterOperatorServiceServer(srv.GRPC(), svc)
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
	cl := opsv1.NewOperatorServiceClient(conn)
	for _, c := range []struct {
		ticket string
		md     []string
		want   string
	}{
		{"INC-BG", []string{"authorization", "Bearer " + opsToken}, operator.BreakGlass},
		{"INC-ALICE", []string{"authorization", "Bearer alice-id"}, "alice@example.com"},
		{"INC-BOB", []string{"authorization", "Bearer console-id", operator.OperatorHeader, "bob"}, "console:console-client/bob"},
	} {
		octx := metadata.NewOutgoingContext(context.Background(), metadata.Pairs(c.md...))
		_, err := cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{
			Authorization: &opsv1.OperatorAuthorization{Ticket: c.ticket, Actor: "mallory"}, EventIds: []string{f.failed}, DryRun: true})
		if err != nil {
			t.Fatalf("%s: %v", c.ticket, err)
		}
		var actor, stated string
		if err := f.pool.QueryRow(context.Background(), `SELECT actor, params->>'stated_actor' FROM operator_audit WHERE ticket = $1`,
			c.ticket).Scan(&actor, &stated); err != nil {
			t.Fatalf("%s: %v", c.ticket, err)
		}
		if actor != c.want || stated != "mallory" {
			t.Errorf("%s: recorded actor %q (stated %q), want %q (stated mallory)", c.ticket, actor, stated, c.want)
		}
	}
	// A console without the operator it acts for is refused; nothing recorded.
	octx := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer console-id"))
	if _, err := cl.RequeueOutboxEvents(octx, &opsv1.RequeueOutboxEventsRequest{
		Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-X", Actor: "mallory"}, EventIds: []string{f.failed}}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("console without x-lossless-operator: %v, want PERMISSION_DENIED", err)
	}
	if n := f.count(t, `SELECT count(*) FROM operator_audit WHERE actor = 'mallory' OR ticket = 'INC-X'`); n != 0 {
		t.Fatalf("%d rows recorded mallory or the refused call", n)
	}
}
