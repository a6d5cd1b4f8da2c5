package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/waitfor"
	"github.com/lossless-dev/lossless/services/provider-sim/internal/engine"
)

// longLease is far beyond every deadline of these tests: a job taken over
// within a deadline was not taken over by lease expiry.
const longLease = 10 * time.Minute

// hold makes jobID look leased by owner, a process that died holding it:
// a fresh claim's token and a lease that outlives the test.
func (b *bundle) hold(t *testing.T, jobID uuid.UUID, owner string) int64 {
	t.Helper()
	var token int64
	if err := b.pool.QueryRow(context.Background(), `UPDATE jobs SET lease_owner = $2,
		lease_until = now() + interval '1 hour', lease_token = lease_token + 1
		WHERE job_id = $1 RETURNING lease_token`, jobID, owner).Scan(&token); err != nil {
		t.Fatal(err)
	}
	return token
}

type lease struct {
	Owner  *string
	Token  int64
	Status string
}

func (b *bundle) lease(t *testing.T, jobID uuid.UUID) lease {
	t.Helper()
	var l lease
	if err := b.pool.QueryRow(context.Background(), `SELECT lease_owner, lease_token, status FROM jobs WHERE job_id = $1`,
		jobID).Scan(&l.Owner, &l.Token, &l.Status); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestRestartedInstanceTakesBackItsPredecessorsJobsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	cfg := testConfig()
	cfg.Lease = longLease
	// Accepted by the instance's previous incarnation, which claimed it and died.
	acc := b.submit(t, b.newEngine(t, cfg), 2)
	held := b.hold(t, acc.JobID, "provider-1/dead")

	cfg.Instance = "provider-1"
	start(t, b.newEngine(t, cfg))
	waitfor.Value(t, 5*time.Second, "job of the dead incarnation done, long before its lease ends", "DONE",
		func() string { return b.jobStatus(t, acc.JobID) })
	if l := b.lease(t, acc.JobID); l.Owner != nil || l.Token <= held+1 {
		t.Fatalf("lease after completion = %+v, want released and a token past %d (release, then claim)", l, held)
	}
	ms := b.obs.all(t)
	key := acc.WorkOrderID.String()
	if c, s := of(ms, typeCompleted, key), of(ms, typeStarted, key); len(c) != 1 || len(s) != 1 {
		t.Fatalf("completed %d, started %d times; want once each", len(c), len(s))
	}
}

func TestOtherInstancesWaitForTheLeasesOfADeadInstance(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	cfg := testConfig()
	cfg.Lease = longLease
	idle := b.newEngine(t, cfg)
	other := b.submit(t, idle, 2)
	otherToken := b.hold(t, other.JobID, "provider-1/dead")
	// Same prefix, another instance: "provider-2" must not read it as its own.
	prefix := b.submit(t, idle, 2)
	prefixToken := b.hold(t, prefix.JobID, "provider-20/dead")

	cfg.Instance = "provider-2"
	e := b.newEngine(t, cfg)
	start(t, e)
	// The engine is running and claiming: it completes a job of its own.
	own := b.submit(t, e, 2)
	waitfor.Value(t, 5*time.Second, "own job done", "DONE", func() string { return b.jobStatus(t, own.JobID) })

	for _, h := range []struct {
		job   uuid.UUID
		owner string
		token int64
	}{{other.JobID, "provider-1/dead", otherToken}, {prefix.JobID, "provider-20/dead", prefixToken}} {
		l := b.lease(t, h.job)
		if l.Owner == nil || *l.Owner != h.owner || l.Token != h.token || l.Status != "ACCEPTED" {
			t.Fatalf("job held by %s: lease = %+v (owner %v), want untouched until it expires", h.owner, l, deref(l.Owner))
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// gate blocks the completion publishes of one engine until opened: a process
// stalled in the middle of a publish (a pause, a partition) that its
// supervisor took for dead and replaced.
type gate struct {
	next    engine.Publisher
	blocked chan struct{}
	once    sync.Once
	opened  chan struct{}
}

func newGate(next engine.Publisher) *gate {
	return &gate{next: next, blocked: make(chan struct{}), opened: make(chan struct{})}
}

func (g *gate) PublishRaw(ctx context.Context, data []byte, attrs map[string]string, key string) (string, error) {
	if attrs[pubsub.AttrEventType] == typeCompleted {
		g.once.Do(func() { close(g.blocked) })
		select {
		case <-g.opened:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	return g.next.PublishRaw(ctx, data, attrs, key)
}

func TestTheDeadIncarnationsLateWritesAreFencedOff(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	cfg := testConfig()
	cfg.Lease = longLease
	cfg.Instance = "provider-1"
	// One worker: the stalled job holds it, so the old incarnation claims
	// nothing else (a dead process claims nothing).
	cfg.Workers = 1
	g := newGate(b.pub)
	oldEngine, err := engine.New(b.pool, g, b.dice, cfg, b.logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := start(t, oldEngine)
	acc := b.submit(t, oldEngine, 2)
	<-g.blocked // completion recorded, its publish stalled

	// The supervisor restarts the instance: a new incarnation, same identity.
	start(t, b.newEngine(t, cfg))
	waitfor.Value(t, 5*time.Second, "job done by the new incarnation", "DONE", func() string { return b.jobStatus(t, acc.JobID) })
	after := b.lease(t, acc.JobID)

	// The old incarnation wakes up: its publish goes out (a duplicate with the
	// same event_id), but every write it then attempts is fenced off.
	close(g.opened)
	old.stop()
	key := acc.WorkOrderID.String()
	done := of(b.obs.all(t), typeCompleted, key)
	if len(done) != 2 || done[0].EventID != done[1].EventID {
		t.Fatalf("completions = %+v, want the same event twice (new incarnation, then the late one)", done)
	}
	var published, count int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE published_at IS NOT NULL),
		coalesce(sum(publish_count), 0) FROM job_events WHERE job_id = $1 AND kind = 'COMPLETED'`, acc.JobID).Scan(&published, &count); err != nil {
		t.Fatal(err)
	}
	if published != 1 || count != 1 {
		t.Fatalf("completion recorded published %d time(s), publish_count %d; want 1/1: the late publish must not be recorded", published, count)
	}
	if l := b.lease(t, acc.JobID); l != after || l.Status != "DONE" || l.Owner != nil {
		t.Fatalf("job after the late writes = %+v, want it as the new incarnation left it (%+v)", l, after)
	}
}
