package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/outbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// An outbox in a schema of its own, in a database whose public schema is
// empty: an unqualified statement would fail with "relation does not exist".
// The test drives every statement of the writer and the relay (append,
// claim, journal, crash charge, dispatch alone, mark published and
// unpublished, journal garbage collection, stats, cleanup) and checks that
// the NOTIFY channel is the schema's.
func TestRelayInAnotherSchema_EveryStatementQualified(t *testing.T) {
	t.Parallel()
	const schema = "outbox_alt"
	ctx := context.Background()
	pool := pgtest.NewPool(t, outbox.Migrations(schema))
	if n := queryInt(t, pool, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != 0 {
		t.Fatalf("public schema holds %d relations, want none", n)
	}
	// One option list configures the writer and the relay; the writer
	// ignores the relay's options.
	opts := []outbox.Option{outbox.WithSchema(schema), outbox.WithDependency("alt", testType)}
	w, err := outbox.NewWriter(opts...)
	if err != nil {
		t.Fatal(err)
	}

	// The trigger notifies the schema's channel.
	listener, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listener.Close(ctx) }()
	if _, err := listener.Exec(ctx, `LISTEN "outbox_alt.outbox"`); err != nil {
		t.Fatal(err)
	}
	a1, a2, b1 := event("a", 1), event("a", 2), event("b", 1)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Append(ctx, tx, a1, a2, b1) }); err != nil {
		t.Fatal(err)
	}
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if n, err := listener.WaitForNotification(nctx); err != nil || n.Channel != "outbox_alt.outbox" {
		t.Fatalf("notification %+v, %v; want one on outbox_alt.outbox", n, err)
	}
	// Closed, so that the only session listening below is the relay's.
	if err := listener.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Journal rows left behind by a relay that died dispatching a1 alone
	// (exclusive) and, before that, the batch of a1 and a2: the claim
	// charges a1 a crash and dispatches the batch one event at a time. A
	// third, stale row names no pending event: garbage collection deletes it.
	ids := map[string]int64{}
	for _, ev := range []outbox.Event{a1, a2} {
		ids[string(ev.Payload)] = int64(queryInt(t, pool, `SELECT id FROM outbox_alt.outbox WHERE event_id = $1`, ev.ID))
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO outbox_alt.outbox_dispatching (ids, exclusive, relay_id, started_at) VALUES
    (ARRAY[$1, $2]::bigint[], false, 'dead', now()),
    (ARRAY[$1]::bigint[], true, 'dead', now()),
    (ARRAY[1000000]::bigint[], false, 'gone', now() - interval '1 hour')`, ids["a/1"], ids["a/2"]); err != nil {
		t.Fatal(err)
	}

	b := &bundle{pool: pool, clock: newClock(), rec: &recorder{fn: func(ev outbox.Event) (outbox.Commit, error) {
		if string(ev.Payload) == "b/1" {
			return nil, retry.Permanent(errors.New("rejected"))
		}
		return nil, nil
	}}}
	r := b.relay(t, pool, outbox.Config{
		PollInterval:    time.Hour, // after the first claim, only a NOTIFY wakes it
		CleanupInterval: 10 * time.Millisecond,
		StatsInterval:   10 * time.Millisecond,
	}, opts...)
	stop := runRelay(t, r)
	waitListeningOn(t, pool, "outbox_alt.outbox")
	waitfor.Condition(t, 10*time.Second, "a/1 and a/2 published, b/1 failed, journal empty", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM outbox_alt.outbox_published`) == 2 &&
			queryInt(t, pool, `SELECT count(*) FROM outbox_alt.outbox WHERE status = 'FAILED'`) == 1 &&
			queryInt(t, pool, `SELECT count(*) FROM outbox_alt.outbox_dispatching`) == 0
	})
	c1 := event("c", 1)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Append(ctx, tx, c1) }); err != nil {
		t.Fatal(err)
	}
	waitfor.Condition(t, 10*time.Second, "c/1 published", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM outbox_alt.outbox_published WHERE event_id = $1`, c1.ID) == 1
	})
	stop()

	for ev, want := range map[*outbox.Event]string{&a1: "PUBLISHED 2", &a2: "PUBLISHED 1", &b1: "FAILED 1", &c1: "PUBLISHED 1"} {
		var got string
		if err := pool.QueryRow(ctx, `SELECT status || ' ' || attempts FROM outbox_alt.outbox_events WHERE event_id = $1`, ev.ID).Scan(&got); err != nil || got != want {
			t.Errorf("event %s: status and attempts %q, %v; want %q", ev.Payload, got, err, want)
		}
	}
	s, err := r.Stats(ctx)
	if err != nil || s.Pending != 0 || s.Failed != 1 {
		t.Errorf("stats %+v, %v; want 0 pending, 1 failed", s, err)
	}
	b.clock.Advance(outbox.DefaultRetention + time.Minute)
	if n, err := r.Cleanup(ctx); err != nil || n != 3 {
		t.Errorf("cleanup deleted %d, %v; want the 3 published events", n, err)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != 0 {
		t.Fatalf("public schema holds %d relations after the run, want none", n)
	}
}

// Two outboxes in one database, in two schemas: a commit in one wakes only
// its own relays, because each schema's trigger notifies its own channel.
func TestNotifyChannelIsPerSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, outbox.Migrations(""), outbox.Migrations("outbox_other"))
	listener, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listener.Close(ctx) }()
	if _, err := listener.Exec(ctx, `LISTEN "public.outbox"; LISTEN "outbox_other.outbox"; LISTEN sentinel`); err != nil {
		t.Fatal(err)
	}
	other, err := outbox.NewWriter(outbox.WithSchema("outbox_other"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		w       outbox.Writer
		channel string
	}{{outbox.Writer{}, "public.outbox"}, {other, "outbox_other.outbox"}} {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return tc.w.Append(ctx, tx, event("x", 1)) }); err != nil {
			t.Fatal(err)
		}
		// Notifications arrive in commit order: everything the append sent
		// arrives before the sentinel committed after it.
		if _, err := pool.Exec(ctx, `NOTIFY sentinel`); err != nil {
			t.Fatal(err)
		}
		var got []string
		nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		for {
			n, err := listener.WaitForNotification(nctx)
			if err != nil {
				cancel()
				t.Fatalf("after %v: %v", got, err)
			}
			if n.Channel == "sentinel" {
				break
			}
			got = append(got, n.Channel)
		}
		cancel()
		if len(got) != 1 || got[0] != tc.channel {
			t.Errorf("an append to %s notified %v, want only %s", tc.channel, got, tc.channel)
		}
	}
}

// A schema name that would need quoting (or could inject SQL) is refused by
// every constructor, with an error naming it; nothing is rendered with it.
func TestConstructorsRefuseAnInvalidSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := map[string]outbox.Dispatcher{testType: b.rec}
	for _, schema := range []string{"Outbox", "pg_outbox", "a-b", "a;drop"} {
		_, err := outbox.NewRelay(b.pool, d, outbox.Config{}, discard(), nil, outbox.WithSchema(schema))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", schema)) {
			t.Errorf("NewRelay with schema %q: %v, want an error naming it", schema, err)
		}
		_, err = outbox.NewWriter(outbox.WithSchema(schema))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", schema)) {
			t.Errorf("NewWriter with schema %q: %v, want an error naming it", schema, err)
		}
	}
}

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
