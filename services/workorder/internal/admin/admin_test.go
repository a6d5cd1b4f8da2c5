package admin_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	workorderv1 "github.com/lossless-dev/lossless/gen/lossless/workorder/v1"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/inbox"
	pkgoperator "github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const token = "s3cret-operator-token-of-32-chars"

type bundle struct {
	pool *pgxpool.Pool
	ops  *admin.Ops
	// inv is the InvoiceIssued consumer the operator replays run through;
	// ps the Pub/Sub client of deps (nil: none).
	inv *invoicing.Invoicing
	ps  *gpubsub.Client
}

// setup builds the operations over a new work-order database; ps (nil:
// none) replays dead letters.
func setup(t *testing.T, ps *gpubsub.Client) bundle {
	t.Helper()
	pool := pgtest.NewPool(t, migrations.WorkOrder()...)
	logger := slog.New(slog.DiscardHandler)
	ops, err := admin.NewOps(pool, logger)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := invoicing.New(pool, invoicing.Config{}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	return bundle{pool: pool, ops: ops, inv: inv, ps: ps}
}

// client serves svc on a loopback port and returns a client for it.
func client(t *testing.T, svc *admin.Service) workorderv1.WorkOrderAdminServiceClient {
	t.Helper()
	var lc net.ListenConfig
	lis, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	workorderv1.RegisterWorkOrderAdminServiceServer(srv, svc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return workorderv1.NewWorkOrderAdminServiceClient(conn)
}

func (b bundle) parked(t *testing.T) {
	t.Helper()
	store, _ := inbox.NewStore(b.pool, nil)
	m := inbox.Message{Source: "provider", EventID: "e1", Payload: []byte("x"), ParkReason: "AMBIGUOUS", ParkError: "two"}
	if _, err := store.Ingest(context.Background(), []inbox.Message{m}); err != nil {
		t.Fatal(err)
	}
}

func (b bundle) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The inbox repairs (OperatorService) and the re-hand-off
// (WorkOrderAdminService) refuse a call without the right token and change
// nothing; with it they work and are audited.
func TestAdmin_UnauthorisedCallsAreRefusedAndChangeNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.parked(t)
	armed, _ := admin.NewService(b.ops, token, slog.New(slog.DiscardHandler))
	disabled, _ := admin.NewService(b.ops, "", slog.New(slog.DiscardHandler))
	armedOps, disabledOps := servedOpsWithToken(t, b, nil, token), servedOpsWithToken(t, b, nil, "")
	authz := &opsv1.OperatorAuthorization{Ticket: "T-1", Actor: "mallory"}
	replay := &opsv1.ReplayInboxEntriesRequest{Authorization: authz, Ids: []int64{1}}
	for _, c := range []struct {
		name string
		svc  *admin.Service
		ops  opsv1.OperatorServiceClient
		md   metadata.MD
		want codes.Code
	}{
		{"no token", armed, armedOps, nil, codes.Unauthenticated},
		{"wrong token", armed, armedOps, metadata.Pairs("authorization", "Bearer guess"), codes.PermissionDenied},
		{"not bearer", armed, armedOps, metadata.Pairs("authorization", token), codes.PermissionDenied},
		{"service without token configured", disabled, disabledOps, metadata.Pairs("authorization", "Bearer "), codes.PermissionDenied},
	} {
		ctx := metadata.NewOutgoingContext(context.Background(), c.md)
		_, err := c.ops.ReplayInboxEntries(ctx, replay)
		if status.Code(err) != c.want {
			t.Errorf("%s: replay got %v, want %v", c.name, err, c.want)
		}
		_, err = client(t, c.svc).RecordReHandOff(ctx, &workorderv1.RecordReHandOffRequest{Authorization: authz, WorkOrderId: uuid.NewString()})
		if status.Code(err) != c.want {
			t.Errorf("%s: re-hand-off got %v, want %v", c.name, err, c.want)
		}
		if _, err := c.ops.ListInboxEntries(ctx, &opsv1.ListInboxEntriesRequest{}); status.Code(err) != c.want {
			t.Errorf("%s: list got %v, want %v", c.name, err, c.want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE status = 'PARKED'`); n != 1 {
		t.Fatal("a refused call changed the entry")
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit`); n != 0 {
		t.Fatal("a refused call wrote an audit row")
	}
	// With the token, the same call works and is audited.
	ctx := asOperator()
	resp, err := armedOps.ReplayInboxEntries(ctx, replay)
	if err != nil || len(resp.GetIds()) != 1 {
		t.Fatalf("authorised replay: %v %v", resp, err)
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'inbox.replay' AND actor = 'break-glass' AND ticket = 'T-1' AND params->>'stated_actor' = 'mallory'`); n != 1 {
		t.Fatal("authorised replay not audited as break-glass with the stated actor kept")
	}
	// Unbounded replay is refused as INVALID_ARGUMENT.
	_, err = armedOps.ReplayInboxEntries(ctx, &opsv1.ReplayInboxEntriesRequest{Authorization: authz})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("replay everything: %v", err)
	}
}

// `workorder inbox ...` (operator.RunCLI) lists, shows, replays and cleans
// up the inbox; `workorder orders re-hand-off` records the F7 trigger; each
// repair is audited.
func TestCLI_ListShowReplayReHandOff(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.parked(t)
	ctx := context.Background()
	run := func(args ...string) (string, error) { return b.cli(t, append([]string{"inbox"}, args...)...) }
	out, err := run("list", "--reason", "AMBIGUOUS")
	if err != nil || !strings.Contains(out, `"park_reason":"AMBIGUOUS"`) {
		t.Fatalf("list: %q %v", out, err)
	}
	if out, err = run("show", "--id", "1"); err != nil || !strings.Contains(out, `"event_id":"e1"`) || !strings.Contains(out, `"payload":"eA=="`) {
		t.Fatalf("show: %q %v", out, err)
	}
	if _, err = run("replay", "--ids", "1"); err == nil {
		t.Fatal("replay without ticket/actor must fail")
	}
	if out, err = run("replay", "--ticket", "INC-9", "--actor", "alice", "--ids", "1", "--dry-run"); err != nil || !strings.Contains(out, "would reopen 1") {
		t.Fatalf("dry run: %q %v", out, err)
	}
	if out, err = run("replay", "--ticket", "INC-9", "--actor", "alice", "--from", "2000-01-01T00:00:00Z", "--to", "2000-01-02T00:00:00Z"); err != nil || !strings.Contains(out, "reopened 0") {
		t.Fatalf("range replay: %q %v", out, err)
	}
	if out, err = run("replay", "--ticket", "INC-9", "--actor", "alice", "--ids", "1"); err != nil || !strings.Contains(out, "reopened 1") {
		t.Fatalf("replay: %q %v", out, err)
	}
	if out, err = run("cleanup", "--ticket", "INC-9", "--actor", "alice", "--dry-run"); err != nil || !strings.Contains(out, "would delete 0") {
		t.Fatalf("cleanup: %q %v", out, err)
	}
	// Re-hand-off: the F7 trigger.
	id := uuid.New()
	if _, err := b.pool.Exec(ctx, `INSERT INTO work_orders (id, customer_id, description, positions, currency_code, unit_price_minor, status)
		VALUES ($1, 'c', 'd', 1, 'EUR', 1, 'HANDED_OFF')`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO waiting_points (work_order_id, cause) VALUES ($1, 'handoff')`, id); err != nil {
		t.Fatal(err)
	}
	var reOut bytes.Buffer
	if err := admin.RunOrdersCLI(ctx, []string{"re-hand-off", "--ticket", "INC-9", "--actor", "alice"}, b.ops, &reOut); !errors.Is(err, pkgoperator.ErrUsage) {
		t.Fatalf("re-hand-off without an order: %v", err)
	}
	reOut.Reset()
	err = admin.RunOrdersCLI(ctx, []string{"re-hand-off", "--ticket", "INC-9", "--actor", "alice", "--order", id.String()}, b.ops, &reOut)
	if err != nil || !strings.Contains(reOut.String(), "2 open waiting points") {
		t.Fatalf("re-hand-off: %q %v", reOut.String(), err)
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit WHERE ticket = 'INC-9'`); n != 5 {
		t.Fatalf("audit rows = %d, want 5", n)
	}
}

// The completions' dead letters (consumer inbox) re-enter through the
// receiver's insert path, once: a dry run inserts nothing, a replay
// inserts each message once and acks it.
func TestReplayDeadLetters_ReentersThroughReceiverPathOnce(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	b := setup(t, emu.Client)
	ctx := context.Background()
	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicWorkOrderCompletedDeadLetter, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	order := uuid.NewString()
	for _, id := range []string{"d1", "d2"} {
		if _, err := pub.Publish(ctx, pubsub.Message{EventID: id, OrderingKey: order,
			Event: &eventsv1.WorkOrderCompleted{EventId: id, WorkOrderId: order, CompletedItems: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	ops := inProcessOps(t, b)
	auth := &opsv1.OperatorAuthorization{Ticket: "INC-3", Actor: "alice"}
	req := func(max int32, dry bool) *opsv1.ReplayDeadLettersRequest {
		return &opsv1.ReplayDeadLettersRequest{Authorization: auth, Consumer: admin.ConsumerInbox, MaxMessages: max, DryRun: dry}
	}
	if _, err := ops.ReplayDeadLetters(ctx, req(0, false)); err == nil {
		t.Fatal("replay without a max must be refused")
	}
	dry, err := ops.ReplayDeadLetters(ctx, req(10, true))
	if err != nil || b.count(t, `SELECT count(*) FROM inbox`) != 0 {
		t.Fatalf("dry run: %v %v", dry, err)
	}
	total := 0
	for range 20 { // pstest may hand out the two messages over several pulls
		res, err := ops.ReplayDeadLetters(ctx, req(10, false))
		if err != nil {
			t.Fatal(err)
		}
		total += int(res.GetOutcomes()["inserted"])
		if b.count(t, `SELECT count(*) FROM inbox`) == 2 {
			break
		}
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE status = 'OPEN' AND source = 'provider'`); n != 2 || total != 2 {
		t.Fatalf("inbox rows %d, inserted %d; want 2", n, total)
	}
	// Everything was acked: another replay finds nothing and changes nothing.
	res, err := ops.ReplayDeadLetters(ctx, req(10, false))
	if err != nil || len(res.GetMessageIds()) != 0 || b.count(t, `SELECT count(*) FROM inbox`) != 2 {
		t.Fatalf("second replay: %v %v", res, err)
	}
	if n := b.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'inbox.replay-dead-letters' AND ticket = 'INC-3'`); n < 3 {
		t.Fatalf("audit rows = %d, want one per replay", n)
	}
}

// A retention_hours that would overflow time.Duration (5124120 h wraps to
// about a day) is refused before anything is deleted.
func TestAdmin_CleanupRetentionOutOfRangeIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	cl := servedOps(t, b, nil)
	ctx := asOperator()
	authz := &opsv1.OperatorAuthorization{Ticket: "T-2", Actor: "alice"}
	for _, h := range []int32{5124120, 87601, 1, -1} {
		_, err := cl.CleanupInbox(ctx, &opsv1.CleanupInboxRequest{Authorization: authz, RetentionHours: h, DryRun: true})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("retention_hours %d: %v, want INVALID_ARGUMENT", h, err)
		}
	}
	if _, err := cl.CleanupInbox(ctx, &opsv1.CleanupInboxRequest{Authorization: authz, RetentionHours: 48, DryRun: true}); err != nil {
		t.Fatalf("retention_hours 48: %v", err)
	}
}
