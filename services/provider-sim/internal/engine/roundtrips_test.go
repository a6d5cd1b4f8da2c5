package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// A job costs five round trips and four commits (ADR 0012, revisions 1
// and 2): the submission's insert; the claim's transaction, which starts the
// job (BEGIN with the claim, then the STARTED message with COMMIT);
// "completed" with its messages and the started publish; and DONE with the
// completion's publish. Five commits before revision 2 (the start was a
// statement of its own), ten before revision 1. Nothing else touches the
// database: the engine's first claim (empty: BEGIN with the claim, then
// ROLLBACK) has returned before the submission, the claim loop then waits
// for the submission's wake-up, not a poll, and no heartbeat falls due.
func TestRoundTripsOfOneJob(t *testing.T) {
	t.Parallel()
	b := setup(t, options{countRoundTrips: true})
	cfg := testConfig()
	cfg.PollInterval = time.Hour
	cfg.Lease = time.Hour
	e := b.newEngine(t, cfg)
	run := start(t, e)
	waitfor.Condition(t, 30*time.Second, "the engine's first claim returned", func() bool { return b.rt.Returned() >= 2 })

	b.rt.Reset()
	acc := b.submit(t, e, 2)
	// Returned, not sent: stopping the engine cancels a statement in flight,
	// and a cancelled DONE becomes a release (a sixth round trip, the job
	// left COMPLETED), which a loaded machine once showed.
	waitfor.Condition(t, 30*time.Second, "the job's five round trips returned", func() bool { return b.rt.Returned() >= 5 })
	run.stop()
	if n, commits := b.rt.Load(), b.rt.Commits(); n != 5 || commits != 4 {
		t.Errorf("round trips %d and commits %d, want 5 and 4", n, commits)
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
