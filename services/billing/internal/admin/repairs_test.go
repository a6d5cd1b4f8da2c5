package admin_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/pubsubtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

// A dead invoice job is requeued over OperatorService (RetryJobs) through
// the queue's own retry:
// the dry run names it and changes nothing but the audit log, the retry
// makes it available with a fresh budget once (leasequeue_job_audit and
// operator_audit rows), a second retry finds nothing to do; the audit log
// reads back newest first, filtered; malformed or unauthenticated calls are
// refused with nothing changed.
func TestRetryJobs_DryRunThenOnceAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRepair(t, nil, intake.Config{JobMaxAttempts: 3}, nil)
	if err := r.in.Handle(ctx, message(t, 1, completion(uuid.NewString()))); err != nil {
		t.Fatal(err)
	}
	claimed, err := r.queue.Claim(ctx, "worker-1", 1, 0)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if err := r.queue.Fail(ctx, claimed[0], retry.Permanent(errors.New("customer unknown"))); err != nil {
		t.Fatal(err)
	}
	id := claimed[0].ID
	cl, octx := r.operatorService(t, nil)

	for name, c := range map[string]struct {
		req   *opsv1.RetryJobsRequest
		field string
	}{
		"no authorization": {&opsv1.RetryJobsRequest{Ids: []int64{id}}, "authorization"},
		"no ticket":        {&opsv1.RetryJobsRequest{Authorization: &opsv1.OperatorAuthorization{Actor: "carol"}, Ids: []int64{id}}, "authorization.ticket"},
		"no actor":         {&opsv1.RetryJobsRequest{Authorization: &opsv1.OperatorAuthorization{Ticket: "INC-9"}, Ids: []int64{id}}, "authorization.actor"},
		"no ids":           {&opsv1.RetryJobsRequest{Authorization: opsAuthz}, "ids"},
	} {
		_, err := cl.RetryJobs(octx, c.req)
		if got := fieldViolations(err); status.Code(err) != codes.InvalidArgument || len(got) != 1 || got[0] != c.field {
			t.Errorf("%s: %v, violations %v; want INVALID_ARGUMENT on %s", name, err, got, c.field)
		}
	}
	if _, err := cl.RetryJobs(ctx, &opsv1.RetryJobsRequest{Authorization: opsAuthz, Ids: []int64{id}}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("retry without a token: %v, want UNAUTHENTICATED", err)
	}
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'dead'`) - r.count(t, `SELECT count(*) FROM operator_audit`); n != 1 {
		t.Fatal("a refused call changed the job or wrote an audit row")
	}

	dry, err := cl.RetryJobs(octx, &opsv1.RetryJobsRequest{Authorization: opsAuthz, Ids: []int64{id, id + 1000}, DryRun: true})
	if err != nil || !dry.GetDryRun() || len(dry.GetIds()) != 1 || dry.GetIds()[0] != id {
		t.Fatalf("dry run: %v %v", dry, err)
	}
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'dead'`) + r.count(t, `SELECT count(*) FROM leasequeue_job_audit`); n != 1 {
		t.Fatal("the dry run changed the job")
	}
	done, err := cl.RetryJobs(octx, &opsv1.RetryJobsRequest{Authorization: opsAuthz, Ids: dry.GetIds()})
	if err != nil || done.GetDryRun() || len(done.GetIds()) != 1 {
		t.Fatalf("retry: %v %v", done, err)
	}
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE id = $1 AND state = 'available' AND attempts = 0`, id); n != 1 {
		t.Fatal("the retried job is not available with a fresh budget")
	}
	again, err := cl.RetryJobs(octx, &opsv1.RetryJobsRequest{Authorization: opsAuthz, Ids: []int64{id}})
	if err != nil || len(again.GetIds()) != 0 {
		t.Fatalf("second retry: %v %v", again, err)
	}
	if n := r.count(t, `SELECT count(*) FROM leasequeue_job_audit WHERE job_id = $1 AND ticket = 'INC-9' AND actor = 'break-glass'`, id); n != 1 {
		t.Fatalf("leasequeue_job_audit rows = %d, want 1", n)
	}

	ocl := cl
	audit, err := ocl.ListOperatorAudit(octx, &opsv1.ListOperatorAuditRequest{Ticket: "INC-9"})
	if err != nil {
		t.Fatal(err)
	}
	recs := audit.GetRecords()
	if len(recs) != 3 || recs[0].GetAffected() != 0 || recs[1].GetAffected() != 1 || recs[1].GetDryRun() ||
		!recs[2].GetDryRun() || recs[2].GetAffected() != 1 || recs[2].GetAction() != "jobs.retry" || recs[2].GetActor() != "break-glass" {
		t.Fatalf("audit, newest first: %v", recs)
	}
	page, err := ocl.ListOperatorAudit(octx, &opsv1.ListOperatorAuditRequest{PageSize: 2})
	if err != nil || len(page.GetRecords()) != 2 || page.GetNextPageToken() == "" {
		t.Fatalf("audit page 1: %v %v", page, err)
	}
	last, err := ocl.ListOperatorAudit(octx, &opsv1.ListOperatorAuditRequest{PageSize: 2, PageToken: page.GetNextPageToken()})
	if err != nil || len(last.GetRecords()) != 1 || last.GetRecords()[0].GetId() != recs[2].GetId() || last.GetNextPageToken() != "" {
		t.Fatalf("audit page 2: %v %v", last, err)
	}
	if other, err := ocl.ListOperatorAudit(octx, &opsv1.ListOperatorAuditRequest{Actor: "mallory"}); err != nil || len(other.GetRecords()) != 0 {
		t.Fatalf("audit of another actor: %v %v", other, err)
	}
	if _, err := ocl.ListOperatorAudit(ctx, &opsv1.ListOperatorAuditRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("audit without a token: %v", err)
	}
}

// A parked message and a dead letter are replayed over gRPC through the
// same operations as the CLI: dry runs change nothing, the replays enqueue
// one job each, once, and every call is audited.
func TestReplayParkedAndDeadLettersOverGRPC(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	emu := pubsubtest.New(t, declaredtest.Topology(t))
	tight := newRepair(t, nil, intake.Config{MaxPayloadBytes: 16}, nil)
	parkedEv := completion(uuid.NewString())
	if err := tight.in.Handle(ctx, message(t, 1, parkedEv)); err != nil {
		t.Fatal(err)
	}
	r := newRepair(t, tight.pool, intake.Config{}, emu.Client) // the cap raised
	cl, octx := r.operatorService(t, emu.Client)

	if _, err := cl.ReplayParkedMessage(octx, &opsv1.ReplayParkedMessageRequest{Id: 1}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("parked replay without authorization: %v", err)
	}
	if _, err := cl.ReplayParkedMessage(ctx, &opsv1.ReplayParkedMessageRequest{Authorization: opsAuthz, Id: 1}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("parked replay without a token: %v", err)
	}
	dry, err := cl.ReplayParkedMessage(octx, &opsv1.ReplayParkedMessageRequest{Authorization: opsAuthz, Id: 1, DryRun: true})
	if err != nil || dry.GetOutcome() != intake.OutcomeEnqueued || !dry.GetDryRun() {
		t.Fatalf("parked dry run: %v %v", dry, err)
	}
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs`) + r.count(t, `SELECT count(*) FROM parked_messages WHERE replayed_at IS NOT NULL`); n != 0 {
		t.Fatal("the parked dry run changed something")
	}
	if _, err := cl.ReplayParkedMessage(octx, &opsv1.ReplayParkedMessageRequest{Authorization: opsAuthz, Id: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ReplayParkedMessage(octx, &opsv1.ReplayParkedMessageRequest{Authorization: opsAuthz, Id: 1}); status.Code(err) != codes.NotFound {
		t.Fatalf("second parked replay: %v, want NOT_FOUND", err)
	}
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE unique_key = $1`, parkedEv.GetWorkOrderId()); n != 1 {
		t.Fatalf("%d jobs for the parked message's order, want 1", n)
	}

	pub, err := pubsub.NewPublisher(emu.Client, topology.TopicWorkOrderEventsDeadLetter, pubsub.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Stop)
	lost := message(t, 0, completion(uuid.NewString()))
	if _, err := pub.PublishRaw(ctx, lost.Data, lost.Attributes, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ReplayDeadLetters(octx, &opsv1.ReplayDeadLettersRequest{Authorization: &opsv1.OperatorAuthorization{Actor: "carol"}, MaxMessages: 5}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("dead-letter replay without a ticket: %v", err)
	}
	var seen []string
	waitfor.Condition(t, 30*time.Second, "the dry run sees the dead letter", func() bool {
		res, err := cl.ReplayDeadLetters(octx, &opsv1.ReplayDeadLettersRequest{Authorization: opsAuthz, MaxMessages: 5, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		seen = res.GetMessageIds()
		return len(seen) == 1
	})
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs`); n != 1 {
		t.Fatal("the dead-letter dry run enqueued a job")
	}
	waitfor.Condition(t, 30*time.Second, "the dead letter is replayed", func() bool {
		res, err := cl.ReplayDeadLetters(octx, &opsv1.ReplayDeadLettersRequest{Authorization: opsAuthz, MaxMessages: 5, MessageIds: seen})
		if err != nil {
			t.Fatal(err)
		}
		return res.GetOutcomes()[intake.OutcomeEnqueued] == 1
	})
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs`); n != 2 {
		t.Fatalf("%d jobs after the dead-letter replay, want 2", n)
	}
	if n := r.count(t, `SELECT count(*) FROM operator_audit WHERE ticket = 'INC-9' AND actor = 'break-glass'
		AND ((action = 'intake.replay-parked' AND affected = 1) OR (action = 'intake.replay-dead-letters' AND dry_run AND affected = 1))`); n < 3 {
		t.Fatalf("audit rows = %d, want the parked dry run and replay and the dead-letter dry run", n)
	}
	if n := r.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'intake.replay-dead-letters' AND NOT dry_run AND affected = 1`); n != 1 {
		t.Fatalf("dead-letter replay audit rows = %d, want 1", n)
	}
}

// `billing jobs retry` runs the same audited path as the RPC: a dry run
// changes nothing but its audit row, the real run requeues the dead job
// once; `billing jobs list` finds it by its work order.
func TestJobsRetryCLI_DryRunThenOnceAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRepair(t, nil, intake.Config{JobMaxAttempts: 3}, nil)
	if err := r.in.Handle(ctx, message(t, 1, completion(uuid.NewString()))); err != nil {
		t.Fatal(err)
	}
	claimed, err := r.queue.Claim(ctx, "worker-1", 1, 0)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if err := r.queue.Fail(ctx, claimed[0], retry.Permanent(errors.New("customer unknown"))); err != nil {
		t.Fatal(err)
	}
	id := strconv.FormatInt(claimed[0].ID, 10)
	if _, err := r.cli(t, "jobs", "retry", "--ids", id); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("retry without ticket and actor: %v", err)
	}
	if _, err := r.cli(t, "jobs", "retry", "--ticket", "INC-7", "--actor", "dan"); !errors.Is(err, operator.ErrUsage) {
		t.Fatalf("retry without ids: %v", err)
	}
	out, err := r.cli(t, "jobs", "retry", "-ids", id, "-ticket", "INC-7", "-actor", "dan", "-dry-run")
	if err != nil || out != "dry run: would requeue 1 dead jobs: ["+id+"]\n" {
		t.Fatalf("dry run: %q %v", out, err)
	}
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'dead'`); n != 1 {
		t.Fatalf("the dry run changed the job: %d dead", n)
	}
	if out, err = r.cli(t, "jobs", "retry", "--ids", id, "--ticket", "INC-7", "--actor", "dan"); err != nil || out != "requeued 1 dead jobs: ["+id+"]\n" {
		t.Fatalf("retry: %q %v", out, err)
	}
	if out, err = r.cli(t, "jobs", "list", "--unique-key", claimed[0].UniqueKey); err != nil ||
		!strings.Contains(out, `"id":"`+id+`"`) || !strings.Contains(out, `"state":"available"`) {
		t.Fatalf("jobs list: %q %v", out, err)
	}
	if n := r.count(t, `SELECT count(*) FROM leasequeue_jobs WHERE state = 'available' AND attempts = 0`); n != 1 {
		t.Fatalf("%d jobs available with a fresh budget, want 1", n)
	}
	if n := r.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'jobs.retry' AND ticket = 'INC-7' AND actor = 'dan'`); n != 2 {
		t.Fatalf("%d audit rows, want the dry run's and the retry's", n)
	}
}
