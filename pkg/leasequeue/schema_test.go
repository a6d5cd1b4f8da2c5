package leasequeue_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/leasequeue"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// Every statement of the package runs against a non-default schema while
// public holds no table at all: an unqualified table name anywhere would fail
// with "relation does not exist".
func TestEveryQueryUsesTheConfiguredSchema(t *testing.T) {
	t.Parallel()
	const schema = "lq_elsewhere"
	pool := pgtest.NewPool(t, leasequeue.Migrations(schema))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE lq_elsewhere.effects (job_id bigint NOT NULL, epoch bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	b := &testBundle{pool: pool}
	if n := b.count(t, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != 0 {
		t.Fatalf("public holds %d relations, want none", n)
	}
	clock := newClock()
	q, err := leasequeue.New(pool, leasequeue.Config{Name: "elsewhere", LeaseDuration: lease},
		slog.New(slog.NewJSONHandler(io.Discard, nil)), nil, leasequeue.WithSchema(schema), leasequeue.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}

	// Claim, heartbeat, rescue (park + claim of expired leases), fenced
	// completion with its effect.
	if n, err := q.Enqueue(ctx, pool, leasequeue.NewJob{UniqueKey: "a"}, leasequeue.NewJob{UniqueKey: "b", MaxAttempts: 1}); err != nil || n != 2 {
		t.Fatalf("enqueue: %d %v", n, err)
	}
	first, err := q.Claim(ctx, "w1", 2, 0)
	if err != nil || len(first) != 2 {
		t.Fatalf("claim: %v %v", first, err)
	}
	clock.Advance(2 * lease)
	rescued, err := q.ClaimExpired(ctx, "w2", 10)
	if err != nil || len(rescued) != 1 || rescued[0].UniqueKey != "a" {
		t.Fatalf("rescue: %v %v", rescued, err)
	}
	if lost, err := q.Heartbeat(ctx, append(first, rescued...)); err != nil || len(lost) != 2 {
		t.Fatalf("heartbeat: lost %v %v, want the two claims of w1", lost, err)
	}
	var stale leasequeue.Job
	for _, j := range first {
		if j.UniqueKey == "a" {
			stale = j
		}
	}
	if err := q.Complete(ctx, stale, recordEffectIn(schema, stale)); !errors.Is(err, leasequeue.ErrLeaseLost) {
		t.Fatalf("stale complete: %v, want ErrLeaseLost", err)
	}
	if err := q.Complete(ctx, rescued[0], recordEffectIn(schema, rescued[0])); err != nil {
		t.Fatal(err)
	}

	// Parking by a permanent failure, audited retry, release, release of a
	// previous incarnation, listing and stats.
	if n, err := q.Enqueue(ctx, pool, leasequeue.NewJob{UniqueKey: "c"}); err != nil || n != 1 {
		t.Fatalf("enqueue: %d %v", n, err)
	}
	c, err := q.Claim(ctx, "w1", 1, 0)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim c: %v %v", c, err)
	}
	if err := q.Fail(ctx, c[0], retry.Permanent(errors.New("bad input"))); err != nil {
		t.Fatal(err)
	}
	if ids, err := q.Retry(ctx, []int64{c[0].ID}, "TICKET-1", "ops"); err != nil || len(ids) != 1 {
		t.Fatalf("retry: %v %v", ids, err)
	}
	c, err = q.Claim(ctx, "w1", 1, 0)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim after retry: %v %v", c, err)
	}
	if n, err := q.Release(ctx, c); err != nil || n != 1 {
		t.Fatalf("release: %d %v", n, err)
	}
	if _, err := q.Claim(ctx, "inst/old", 1, 0); err != nil {
		t.Fatal(err)
	}
	if released, parked, err := q.ReleaseInstance(ctx, "inst", "inst/new"); err != nil || released != 1 || parked != 0 {
		t.Fatalf("release instance: %d %d %v", released, parked, err)
	}
	infos, err := q.List(ctx, pool, leasequeue.ListFilter{})
	if err != nil || len(infos) != 3 {
		t.Fatalf("list: %v %v", infos, err)
	}
	if byKey, err := q.List(ctx, pool, leasequeue.ListFilter{UniqueKey: "a"}); err != nil || len(byKey) != 1 ||
		byKey[0].UniqueKey != "a" || byKey[0].State != leasequeue.StateDone {
		t.Fatalf("list by key a: %v %v, want the done job a", byKey, err)
	}
	if none, err := q.List(ctx, pool, leasequeue.ListFilter{UniqueKey: "a", State: leasequeue.StateDead}); err != nil || len(none) != 0 {
		t.Fatalf("list by key a, dead: %v %v, want none", none, err)
	}
	if err := q.RefreshStats(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := q.Stats(ctx, pool)
	if err != nil || s.Available != 1 || s.Dead != 1 {
		t.Fatalf("stats: %+v %v, want 1 available (c), 1 dead (b, expired on its last attempt)", s, err)
	}

	// The Worker's own path (LISTEN, keyset claim, group commit) finishes c.
	w, err := leasequeue.NewWorker(q, func(_ context.Context, j leasequeue.Job) (leasequeue.Complete, error) {
		return recordEffectIn(schema, j), nil
	}, fastWorker(leasequeue.WorkerConfig{Workers: 2}))
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	waitfor.Value(t, 10*time.Second, "job c done", 1, func() int {
		return b.count(t, `SELECT count(*) FROM lq_elsewhere.leasequeue_jobs WHERE unique_key = 'c' AND state = 'done'`)
	})
	if n := b.count(t, `SELECT count(*) FROM lq_elsewhere.effects`); n != 2 {
		t.Fatalf("effects: %d, want 2 (a and c, once each)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM lq_elsewhere.leasequeue_job_audit WHERE ticket = 'TICKET-1'`); n != 1 {
		t.Fatalf("audit rows: %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != 0 {
		t.Fatalf("public holds %d relations after the run, want none", n)
	}
}

// A queue name of the maximum length (60), in a non-default schema, makes a
// NOTIFY channel longer than PostgreSQL's 63-byte identifiers; pg_notify would
// refuse it and every Enqueue would fail.
func TestLongestQueueNameEnqueuesAndWakesItsWorker(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, leasequeue.Migrations("lq_long_name_schema"))
	ctx := context.Background()
	q, err := leasequeue.New(pool, leasequeue.Config{Name: strings.Repeat("q", 60)},
		slog.New(slog.NewJSONHandler(io.Discard, nil)), nil, leasequeue.WithSchema("lq_long_name_schema"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := leasequeue.NewWorker(q, func(context.Context, leasequeue.Job) (leasequeue.Complete, error) { return nil, nil },
		// A long poll: the job is found promptly only through the NOTIFY.
		leasequeue.WorkerConfig{PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	b := &testBundle{pool: pool}
	// The worker's LISTEN may start after the first NOTIFY: enqueue until one
	// is heard.
	waitfor.Condition(t, 10*time.Second, "a job done through a NOTIFY", func() bool {
		if _, err := q.Enqueue(ctx, pool, leasequeue.NewJob{}); err != nil {
			t.Fatalf("enqueue: %v", err)
		}
		return b.count(t, `SELECT count(*) FROM lq_long_name_schema.leasequeue_jobs WHERE state = 'done'`) > 0
	})
}

// A schema name that would need quoting (or could inject SQL) is refused,
// with an error naming it; nothing is rendered with it.
func TestNewRefusesAnInvalidSchema(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, leasequeue.Migrations(""))
	for _, schema := range []string{"Billing", "pg_jobs", "a-b", "x; DROP TABLE y"} {
		_, err := leasequeue.New(pool, leasequeue.Config{Name: "q"}, slog.New(slog.DiscardHandler), nil, leasequeue.WithSchema(schema))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", schema)) {
			t.Errorf("WithSchema(%q): %v, want an error naming it", schema, err)
		}
	}
}

// The heartbeat must fit in the queue's lease; the check needs both configs.
func TestWorkerConfigIsValidatedAgainstItsQueue(t *testing.T) {
	t.Parallel()
	queue := leasequeue.Config{Name: "q", LeaseDuration: 10 * time.Second}
	if err := (leasequeue.WorkerConfig{HeartbeatInterval: 10 * time.Second}).ValidateFor(queue); err == nil ||
		!strings.Contains(err.Error(), "HeartbeatInterval") {
		t.Errorf("heartbeat = lease: %v, want an error naming HeartbeatInterval", err)
	}
	if err := (leasequeue.WorkerConfig{}).ValidateFor(queue); err != nil {
		t.Errorf("defaults (heartbeat a third of the lease): %v", err)
	}
	if err := (leasequeue.WorkerConfig{HeartbeatInterval: time.Minute}).ValidateFor(leasequeue.Config{Name: "q"}); err == nil {
		t.Error("heartbeat 1m with the default 30s lease accepted")
	}
	pool := pgtest.NewPool(t, leasequeue.Migrations(""))
	q, err := leasequeue.New(pool, queue, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, leasequeue.Job) (leasequeue.Complete, error) { return nil, nil }
	if _, err := leasequeue.NewWorker(q, noop, leasequeue.WorkerConfig{HeartbeatInterval: 20 * time.Second}); err == nil {
		t.Error("NewWorker accepted a heartbeat longer than the queue's lease")
	}
}

// recordEffectIn is recordEffect for an effects table in schema.
func recordEffectIn(schema string, job leasequeue.Job) leasequeue.Complete {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.effects (job_id, epoch) VALUES ($1, $2)`, job.ID, job.Epoch)
		return err
	}
}
