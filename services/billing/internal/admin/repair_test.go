package admin_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/billing/internal/admin"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

type repair struct {
	pool  *pgxpool.Pool
	queue *leasequeue.Queue
	in    *intake.Intake  // the intake the operator replays consume through
	ps    *gpubsub.Client // nil: no dead-letter replay
}

// newRepair builds the operations over a billing database, their intake
// configured with inCfg; ps (nil: none) replays dead letters.
func newRepair(t *testing.T, pool *pgxpool.Pool, inCfg intake.Config, ps *gpubsub.Client) repair {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	if pool == nil {
		pool = pgtest.NewPool(t, migrations.Billing()...)
	}
	queue, err := leasequeue.New(pool, leasequeue.Config{Name: "invoices"}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := intake.New(pool, queue, inCfg, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	return repair{pool: pool, queue: queue, in: in, ps: ps}
}

func (r repair) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := r.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (r repair) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	// The commands, as main runs them: in process, no token.
	deps, err := admin.OperatorDeps(r.pool, r.queue, r.in, r.ps, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ops, err := operator.NewInProcess(deps)
	if err != nil {
		t.Fatal(err)
	}
	err = operator.RunCLI(context.Background(), args, loggedIn(t, ops, args, "alice"), admin.ConsumerIntake, &out)
	return out.String(), err
}

// Dead letters of billing.workorder-events re-enter through the intake: a
// completion becomes one invoice job however often it is replayed or was
// consumed already, a dry run changes nothing and leaves the messages on the
// subscription, a poison message ends parked with its reason, and every run
// is audited.
func TestReplayDeadLetters_EnqueuesOnceParksPoisonAudits(t *testing.T) {
	t.Parallel()
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	r := newRepair(t, nil, intake.Config{}, emu.Client)
	ctx := context.Background()
	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicWorkOrderEventsDeadLetter, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	lost, stored := completion(uuid.NewString()), completion(uuid.NewString())
	// stored was consumed after all, before it was dead-lettered again.
	if err := r.in.Handle(ctx, message(t, 1, stored)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range []*eventsv1.WorkOrderCompletionRecorded{lost, lost, stored} {
		m := message(t, 0, ev)
		if _, err := pub.PublishRaw(ctx, m.Data, m.Attributes, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.PublishRaw(ctx, []byte("\xff not a proto"), pubsub.EventAttributes("e-poison", intake.EventType, 1, time.Now()), ""); err != nil {
		t.Fatal(err)
	}

	if _, err := r.cli(t, "dead-letters", "replay", "-max", "10"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("replay without ticket and actor: %v", err)
	}
	if _, err := r.cli(t, "dead-letters", "replay", "-ticket", "INC-5", "-actor", "alice"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("replay without -max: %v", err)
	}
	out, err := r.cli(t, "dead-letters", "replay", "-ticket", "INC-5", "-actor", "alice", "-max", "10", "-dry-run")
	if err != nil || !strings.HasPrefix(out, "dry run: would replay ") || strings.HasPrefix(out, "dry run: would replay 0 ") {
		t.Fatalf("dry run: %q %v", out, err)
	}
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs`) + r.count(t, `SELECT count(*) FROM parked_messages`); n != 1 {
		t.Fatalf("dry run changed jobs or parked messages (%d rows, want the one job consumed live)", n)
	}

	outcomes := map[string]int{}
	taken := 0
	waitfor.Condition(t, 30*time.Second, "all four dead letters replayed", func() bool {
		out, err := r.cli(t, "dead-letters", "replay", "-ticket", "INC-5", "-actor", "alice", "-max", "10")
		if err != nil {
			t.Fatal(err)
		}
		// "replayed N dead letters [ids] (outcome n, ..., failed 0)"
		var n int
		if _, err := fmt.Sscanf(out, "replayed %d dead letters", &n); err != nil {
			t.Fatalf("output %q: %v", out, err)
		}
		taken += n
		counts := out[strings.LastIndex(out, "(")+1 : strings.LastIndex(out, ")")]
		for c := range strings.SplitSeq(counts, ", ") {
			var o string
			var k int
			if _, err := fmt.Sscanf(c, "%s %d", &o, &k); err != nil {
				t.Fatalf("count %q: %v", c, err)
			}
			outcomes[o] += k
		}
		return taken == 4 // the dry run released all of them
	})
	if outcomes[intake.OutcomeEnqueued] != 1 || outcomes[intake.OutcomeDuplicate] != 2 || outcomes[intake.OutcomeParked] != 1 {
		t.Fatalf("outcomes %v; want enqueued 1, duplicate 2, parked 1", outcomes)
	}
	for _, ev := range []*eventsv1.WorkOrderCompletionRecorded{lost, stored} {
		if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE unique_key = $1`, ev.GetWorkOrderId()); n != 1 {
			t.Fatalf("order %s: %d invoice jobs, want 1", ev.GetWorkOrderId(), n)
		}
	}
	var sub, reason string
	if err := r.pool.QueryRow(ctx, `SELECT subscription, reason FROM parked_messages WHERE replayed_at IS NULL`).Scan(&sub, &reason); err != nil {
		t.Fatalf("poison dead letter not parked: %v", err)
	}
	if sub != topology.SubWorkOrderEvents || reason == "" {
		t.Fatalf("parked from %q with reason %q", sub, reason)
	}

	// Everything was acked: another run finds nothing and changes nothing.
	out, err = r.cli(t, "dead-letters", "replay", "-ticket", "INC-5", "-actor", "alice", "-max", "10")
	if err != nil || out != "replayed 0 dead letters [] (failed 0)\n" {
		t.Fatalf("second run: %q %v", out, err)
	}
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs`); n != 2 {
		t.Fatalf("%d jobs after a second run, want 2", n)
	}
	if n := r.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'intake.replay-dead-letters' AND ticket = 'INC-5' AND actor = 'alice' AND dry_run`); n != 1 {
		t.Fatalf("dry run audit rows = %d, want 1", n)
	}
	if n := r.count(t, `SELECT coalesce(sum(affected), 0) FROM operator_audit
		WHERE action = 'intake.replay-dead-letters' AND NOT dry_run AND ticket = 'INC-5'`); n != 4 {
		t.Fatalf("audited replayed dead letters = %d, want 4", n)
	}
}

// A message parked because of a cause an operator can fix (here a payload
// above the intake's cap, then raised) is consumed once by `billing parked
// replay`: refused while the cause persists, a dry run changes nothing but
// the audit, the replay enqueues one job and records ticket and actor on the
// row, and a second replay finds the row closed.
func TestReplayParked_AfterCauseFixedEnqueuesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tight := newRepair(t, nil, intake.Config{MaxPayloadBytes: 16}, nil)
	ev := completion(uuid.NewString())
	if err := tight.in.Handle(ctx, message(t, 1, ev)); err != nil {
		t.Fatal(err)
	}
	out, err := tight.cli(t, "parked", "list") // parked unparsed: no work order known
	if err != nil || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"id":"1",`) || !strings.Contains(out, `"subscription":"billing.workorder-events"`) {
		t.Fatalf("parked list: %q %v", out, err)
	}
	if _, err := tight.cli(t, "parked", "replay", "-id", "1"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("replay without ticket and actor: %v", err)
	}
	// The cause is still there: refused, nothing changes.
	if _, err := tight.cli(t, "parked", "replay", "-id", "1", "-ticket", "CHG-8", "-actor", "bob"); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), intake.ErrStillRefused.Error()) {
		t.Fatalf("replay with the cap unchanged: %v", err)
	}
	fixed := newRepair(t, tight.pool, intake.Config{}, nil) // the cap raised to its default
	out, err = fixed.cli(t, "parked", "replay", "-id", "1", "-ticket", "CHG-8", "-actor", "bob", "-dry-run")
	if err != nil || out != "dry run: would replay parked message 1: enqueued\n" {
		t.Fatalf("dry run: %q %v", out, err)
	}
	if n := fixed.count(t, `SELECT count(*) FROM leasequeue_jobs`) + fixed.count(t, `SELECT count(*) FROM processed_events`) +
		fixed.count(t, `SELECT count(*) FROM parked_messages WHERE replayed_at IS NOT NULL`); n != 0 {
		t.Fatal("the dry run changed jobs, markers or the parked row")
	}
	out, err = fixed.cli(t, "parked", "replay", "-id", "1", "-ticket", "CHG-8", "-actor", "bob")
	if err != nil || out != "replayed parked message 1: enqueued\n" {
		t.Fatalf("replay: %q %v", out, err)
	}
	if _, err := fixed.cli(t, "parked", "replay", "-id", "1", "-ticket", "CHG-8", "-actor", "bob"); status.Code(err) != codes.NotFound {
		t.Fatalf("second replay: %v", err)
	}
	if n := fixed.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE unique_key = $1`, ev.GetWorkOrderId()); n != 1 {
		t.Fatalf("%d invoice jobs, want 1", n)
	}
	if n := fixed.count(t, `SELECT count(*) FROM parked_messages WHERE id = 1 AND replayed_by = 'bob' AND ticket = 'CHG-8' AND replayed_at IS NOT NULL`); n != 1 {
		t.Fatal("the parked row does not record the replay")
	}
	if n := fixed.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'intake.replay-parked' AND ticket = 'CHG-8' AND actor = 'bob'
		AND params->>'outcome' = 'enqueued'`); n != 2 {
		t.Fatalf("intake.replay-parked audit rows = %d, want 2 (dry run and replay)", n)
	}
	if out, _ := fixed.cli(t, "parked", "list"); out != "" {
		t.Fatalf("replayed row still listed: %q", out)
	}
}

// loggedIn is ops run by the operator the command names with --actor (the
// test stands in for the command line's login, operator.ActingAs), or by
// def.
func loggedIn(t *testing.T, ops operator.Operations, args []string, def string) operator.Operations {
	t.Helper()
	as := def
	for i, a := range args {
		if (a == "--actor" || a == "-actor") && i+1 < len(args) && args[i+1] != "" {
			as = args[i+1]
		}
	}
	ops, err := operator.ActingAs(ops, as)
	if err != nil {
		t.Fatal(err)
	}
	return ops
}
