package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// A job costs five statements, each its own transaction and round trip
// (ADR 0012, revision 1): the submission's insert, the claim, "started"
// with its message, "completed" with its messages and the started publish,
// and DONE with the completion's publish. Ten commits and eighteen
// statements before. Nothing else touches the database: the engine's first
// (empty) claim has returned before the submission, the claim loop then
// waits for the submission's wake-up, not a poll, and no heartbeat falls
// due.
func TestRoundTripsOfOneJob(t *testing.T) {
	t.Parallel()
	b := setup(t, options{countRoundTrips: true})
	cfg := testConfig()
	cfg.PollInterval = time.Hour
	cfg.Lease = time.Hour
	e := b.newEngine(t, cfg)
	run := start(t, e)
	waitfor.Condition(t, 30*time.Second, "the engine's first claim returned", func() bool { return b.rt.Returned() >= 1 })

	b.rt.Reset()
	acc := b.submit(t, e, 2)
	// Returned, not sent: stopping the engine cancels a statement in flight,
	// and a cancelled DONE becomes a release (a sixth round trip, the job
	// left COMPLETED), which a loaded machine once showed.
	waitfor.Condition(t, 30*time.Second, "the job's five statements returned", func() bool { return b.rt.Returned() >= 5 })
	run.stop()
	if n := b.rt.Load(); n != 5 {
		t.Errorf("round trips %d, want 5", n)
	}

	if s := b.jobStatus(t, acc.JobID); s != "DONE" {
		t.Fatalf("status %s, want DONE", s)
	}
	var events, recorded int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE published_at IS NOT NULL AND publish_count = copies)
		FROM job_events WHERE job_id = $1`, acc.JobID).Scan(&events, &recorded); err != nil {
		t.Fatal(err)
	}
	if events != 2 || recorded != 2 {
		t.Fatalf("%d events, %d recorded as published once; want started and completed, both recorded", events, recorded)
	}
	key := acc.WorkOrderID.String()
	ms := b.obs.all(t)
	if c, s := of(ms, typeCompleted, key), of(ms, typeStarted, key); len(c) != 1 || len(s) != 1 {
		t.Fatalf("completed %d, started %d times; want once each", len(c), len(s))
	}
}
