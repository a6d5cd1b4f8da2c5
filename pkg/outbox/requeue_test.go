package outbox_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// requeueRow is an outbox row as the requeue changes it.
type requeueRow struct {
	Status      string
	Attempts    int
	LastError   string
	NextAttempt *time.Time
	LeaseOwner  *string
}

func requeueRowOf(t *testing.T, pool *pgxpool.Pool, schema string, id uuid.UUID) requeueRow {
	t.Helper()
	var r requeueRow
	err := pool.QueryRow(context.Background(), `SELECT status, attempts, coalesce(last_error, ''), next_attempt_at, lease_owner FROM `+
		schema+`.outbox WHERE event_id = $1`, id).Scan(&r.Status, &r.Attempts, &r.LastError, &r.NextAttempt, &r.LeaseOwner)
	if err != nil {
		t.Fatalf("row %s: %v", id, err)
	}
	return r
}

// A relay leaves the first event of an aggregate FAILED (its dispatcher
// refuses it permanently) and the second waits behind it. A dry run reports
// the FAILED one and changes nothing; the requeue makes it PENDING with a
// fresh budget and the note in front of its error; with the dispatcher
// fixed, a relay publishes both, in aggregate order, once each. Ids that
// are not FAILED (pending, published, unknown) are reported and left alone.
// In a non-default schema: every statement is qualified.
func TestRequeue_FailedEventIsPublishedAgainBeforeTheEventsBehindIt(t *testing.T) {
	t.Parallel()
	const schema = "ops_requeue"
	ctx := context.Background()
	pool := pgtest.NewPool(t, outbox.Migrations(schema))
	opts := []outbox.Option{outbox.WithSchema(schema)}
	w, err := outbox.NewWriter(opts...)
	if err != nil {
		t.Fatal(err)
	}
	first, second := event("wo-7", 1), event("wo-7", 2)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Append(ctx, tx, first, second) }); err != nil {
		t.Fatal(err)
	}

	var (
		fixed     atomic.Bool
		mu        sync.Mutex
		delivered []uuid.UUID
	)
	dispatchers := map[string]outbox.Dispatcher{testType: outbox.DispatcherFunc(func(_ context.Context, ev outbox.Event) (outbox.Commit, error) {
		if ev.ID == first.ID && !fixed.Load() {
			return nil, retry.Permanent(errors.New("destination refuses the payload"))
		}
		mu.Lock()
		delivered = append(delivered, ev.ID)
		mu.Unlock()
		return nil, nil
	})}
	broken, err := outbox.NewRelay(pool, dispatchers, outbox.Config{}, discard(), nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	processBatch(t, broken)
	processBatch(t, broken) // the second event stays blocked
	failed := requeueRowOf(t, pool, schema, first.ID)
	if failed.Status != "FAILED" || failed.Attempts != 1 || failed.LastError == "" {
		t.Fatalf("first event after the broken dispatch: %+v, want FAILED after 1 attempt", failed)
	}
	mu.Lock()
	early := slices.Clone(delivered)
	mu.Unlock()
	if got := requeueRowOf(t, pool, schema, second.ID); got.Status != "PENDING" || got.Attempts != 0 || len(early) != 0 {
		t.Fatalf("second event %+v, delivered %v: want it PENDING behind the failed one, nothing delivered", got, early)
	}

	rq, err := outbox.NewRequeuer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	unknown := uuid.New()
	const note = "requeued by jdoe, ticket OPS-123"
	asked := []uuid.UUID{first.ID, second.ID, unknown, first.ID}
	wantSkipped := []outbox.SkippedEvent{{EventID: second.ID, State: outbox.StatePending}, {EventID: unknown, State: ""}}

	dry, err := rq.Requeue(ctx, pool, outbox.RequeueRequest{EventIDs: asked, Note: note, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(dry.Requeued) != 1 || dry.Requeued[0].EventID != first.ID || dry.Requeued[0].LastError != failed.LastError ||
		dry.Requeued[0].AggregateID != "wo-7" || !dry.DryRun || !slices.Equal(dry.Skipped, wantSkipped) {
		t.Fatalf("dry run: %+v, want the failed event requeued and %v skipped", dry, wantSkipped)
	}
	if got := requeueRowOf(t, pool, schema, first.ID); got.Status != "FAILED" || got.Attempts != 1 || got.LastError != failed.LastError {
		t.Fatalf("the dry run changed the failed event: %+v", got)
	}

	// A relay listens on the schema's channel: the requeue wakes it and
	// rewinds its cursor to the requeued row.
	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, `LISTEN "`+schema+`.outbox"`); err != nil {
		t.Fatal(err)
	}
	res, err := rq.Requeue(ctx, pool, outbox.RequeueRequest{EventIDs: asked, Note: note})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Requeued) != 1 || res.Requeued[0].EventID != first.ID || res.DryRun || !slices.Equal(res.Skipped, wantSkipped) {
		t.Fatalf("requeue: %+v", res)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if n, err := listener.Conn().WaitForNotification(wctx); err != nil || n.Payload != strconv.FormatInt(res.Requeued[0].Seq, 10) {
		t.Fatalf("notification %+v %v, want the requeued row's id %d", n, err, res.Requeued[0].Seq)
	}
	got := requeueRowOf(t, pool, schema, first.ID)
	if got.Status != "PENDING" || got.Attempts != 0 || got.NextAttempt != nil || got.LeaseOwner != nil ||
		got.LastError != note+"; was: "+failed.LastError {
		t.Fatalf("requeued event: %+v", got)
	}
	if again, err := rq.Requeue(ctx, pool, outbox.RequeueRequest{EventIDs: []uuid.UUID{first.ID}, Note: note}); err != nil ||
		len(again.Requeued) != 0 || !slices.Equal(again.Skipped, []outbox.SkippedEvent{{EventID: first.ID, State: outbox.StatePending}}) {
		t.Fatalf("a second requeue: %+v %v, want the event skipped as PENDING", again, err)
	}

	fixed.Store(true)
	stop := runRelay(t, func() *outbox.Relay {
		r, err := outbox.NewRelay(pool, dispatchers, outbox.Config{}, discard(), nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}())
	waitfor.Condition(t, 10*time.Second, "both events published", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_published WHERE event_id = ANY($1)`,
			[]uuid.UUID{first.ID, second.ID}).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 2
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(delivered, []uuid.UUID{first.ID, second.ID}) {
		t.Fatalf("delivered %v, want %v once each, in aggregate order", delivered, []uuid.UUID{first.ID, second.ID})
	}
	late, err := rq.Requeue(ctx, pool, outbox.RequeueRequest{EventIDs: []uuid.UUID{first.ID}, Note: note})
	if err != nil || len(late.Requeued) != 0 || !slices.Equal(late.Skipped, []outbox.SkippedEvent{{EventID: first.ID, State: outbox.StatePublished}}) {
		t.Fatalf("requeue of a published event: %+v %v, want it skipped as PUBLISHED", late, err)
	}
}

// Requeue refuses an empty or oversized id list and a missing note before
// touching the database.
func TestRequeue_RefusesUnboundedOrUnattributedRequests(t *testing.T) {
	t.Parallel()
	rq, err := outbox.NewRequeuer()
	if err != nil {
		t.Fatal(err)
	}
	many := make([]uuid.UUID, outbox.MaxRequeueEvents+1)
	for i := range many {
		many[i] = uuid.New()
	}
	for name, req := range map[string]outbox.RequeueRequest{
		"no ids":       {Note: "requeued by jdoe, ticket OPS-1"},
		"too many ids": {EventIDs: many, Note: "requeued by jdoe, ticket OPS-1"},
		"no note":      {EventIDs: []uuid.UUID{uuid.New()}, Note: "  "},
		"NUL in note":  {EventIDs: []uuid.UUID{uuid.New()}, Note: "jdoe\x00"},
	} {
		// A nil handle: a refused request must not reach the database.
		if _, err := rq.Requeue(context.Background(), nil, req); !errors.Is(err, outbox.ErrInvalidRequeue) {
			t.Errorf("%s: %v, want ErrInvalidRequeue", name, err)
		}
	}
	if _, err := outbox.NewRequeuer(outbox.WithSchema("bad schema")); err == nil {
		t.Error("NewRequeuer accepted an invalid schema")
	}
}
