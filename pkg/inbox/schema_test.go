package inbox_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lossless-dev/lossless/pkg/backoff"
	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/permanent"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// The whole path (ingest, NOTIFY wake-up, relay, Store.MakeDue, operator
// actions, monitor) in a schema other than public, with public empty: an
// unqualified name anywhere in the package fails with "relation does not
// exist".
func TestNonDefaultSchema_EveryQueryIsQualified(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, inbox.Migrations("wo"))
	ctx := context.Background()
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(`SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != 0 {
		t.Fatalf("public holds %d relations, want none", n)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE wo.effects (event_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.NewStore(pool, nil, inbox.WithSchema("Wo")); err == nil {
		t.Fatal("an invalid schema name was accepted")
	}
	opt := inbox.WithSchema("wo")
	store, err := inbox.NewStore(pool, nil, opt)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := inbox.NewOps(pool, opt)
	if err != nil {
		t.Fatal(err)
	}
	// "later" waits for MakeDue, "bad" is parked until it is healed and an
	// operator replays it; everything else applies at once. healed changes
	// only after Run returned, so the handler reads it race-free.
	healed := false
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, e *inbox.Entry) error {
		switch {
		case e.EventID == "later" && e.Attempts == 0:
			return inbox.Defer("NOT_WAITING", errors.New("not waiting yet"))
		case e.EventID == "bad" && !healed:
			return inbox.Park("AMBIGUOUS", errors.New("two waiting points"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO wo.effects (event_id) VALUES ($1)`, e.EventID)
		return err
	})
	// Polling and sweeping are an hour apart: only a NOTIFY on the schema's
	// channel explains a prompt apply.
	relay, err := inbox.NewRelay(pool, h, inbox.Config{PollInterval: time.Hour, SweepInterval: time.Hour,
		DeferBackoff: backoff.Policy{Base: time.Hour, Max: time.Hour}}, slog.New(slog.DiscardHandler), nil, opt)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	stopped := false
	stopRelay := func() {
		if !stopped {
			stopped = true
			stop()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
		}
	}
	t.Cleanup(stopRelay)
	waitfor.Condition(t, 10*time.Second, "relay listening", func() bool {
		return count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`) >= 1
	})

	poison := msg("pubsub-message:1", "", "\xff")
	poison.ParkReason, poison.ParkError = inbox.ReasonPoison, "unparseable"
	if _, err := store.Ingest(ctx, []inbox.Message{msg("e1", "k1", "p"), msg("later", "k2", "p"), msg("bad", "k3", "p"), poison}); err != nil {
		t.Fatal(err)
	}
	if res, err := store.Ingest(ctx, []inbox.Message{msg("e1", "k1", "other payload")}); err != nil || res.Conflicts != 1 {
		t.Fatalf("conflict: %+v %v", res, err)
	}
	waitfor.Value(t, 10*time.Second, "e1 applied and later deferred after NOTIFY", 2, func() int {
		return count(`SELECT count(*) FROM wo.inbox WHERE (event_id = 'e1' AND status = 'APPLIED') OR (event_id = 'later' AND attempts = 1)`)
	})
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		n, err := store.MakeDue(ctx, tx, "k2")
		if err == nil && n != 1 {
			err = errors.New("Store.MakeDue made no entry due")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitfor.Value(t, 10*time.Second, "later applied after MakeDue", 1, func() int {
		return count(`SELECT count(*) FROM wo.effects WHERE event_id = 'later'`)
	})
	stopRelay()

	mon, err := inbox.NewMonitor(pool, inbox.MonitorConfig{}, slog.New(slog.DiscardHandler), nil, opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := mon.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if s := mon.Snapshot(); s.Parked["AMBIGUOUS"] != 1 || s.Parked[inbox.ReasonPoison] != 1 || s.OpenConflicts != 1 || s.OpenEntries != 0 {
		t.Fatalf("monitor snapshot %+v", s)
	}

	parked, err := ops.List(ctx, inbox.ListFilter{Reason: "AMBIGUOUS"})
	if err != nil || len(parked) != 1 || parked[0].EventID != "bad" {
		t.Fatalf("parked entries: %+v %v", parked, err)
	}
	// By event id: every status unless one is asked for; another source's
	// ids are not these.
	events := []string{"e1", "later", "bad", "never-received"}
	byEvent, err := ops.List(ctx, inbox.ListFilter{Source: "test", EventIDs: events})
	if err != nil || len(byEvent) != 3 || byEvent[0].EventID != "e1" || byEvent[0].Status != inbox.StatusApplied ||
		byEvent[1].EventID != "later" || byEvent[2].EventID != "bad" || byEvent[2].Status != inbox.StatusParked {
		t.Fatalf("entries by event id: %+v %v", byEvent, err)
	}
	if applied, err := ops.List(ctx, inbox.ListFilter{Source: "test", EventIDs: events, Status: inbox.StatusApplied}); err != nil || len(applied) != 2 {
		t.Fatalf("applied entries by event id: %+v %v", applied, err)
	}
	if other, err := ops.List(ctx, inbox.ListFilter{Source: "elsewhere", EventIDs: events}); err != nil || len(other) != 0 {
		t.Fatalf("another source's entries: %+v %v", other, err)
	}
	auth := inbox.Authorization{Ticket: "INC-7", Actor: "dana"}
	healed = true
	if _, err := ops.Replay(ctx, inbox.ReplayRequest{Authorization: auth, IDs: []int64{parked[0].ID}}); err != nil {
		t.Fatal(err)
	}
	drain(t, relay)
	if e, err := ops.Get(ctx, parked[0].ID); err != nil || e.Status != inbox.StatusApplied {
		t.Fatalf("replayed entry: %+v %v", e, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE wo.inbox SET processed_at = now() - interval '90 days' WHERE status = 'APPLIED'`); err != nil {
		t.Fatal(err)
	}
	if n, err := ops.Cleanup(ctx, inbox.CleanupRequest{Authorization: auth}); err != nil || n != 3 {
		t.Fatalf("cleanup deleted %d (%v), want the 3 applied entries", n, err)
	}
	if n := count(`SELECT count(*) FROM wo.inbox_audit WHERE ticket = 'INC-7' AND action IN ('inbox.replay', 'inbox.cleanup')`); n != 2 {
		t.Fatalf("audit rows = %d, want 2", n)
	}
	if n := count(`SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != 0 {
		t.Fatalf("public holds %d relations after the run, want none", n)
	}
}

// Two inboxes in one database notify on their own channels, so neither
// wakes the other's relays.
func TestTwoSchemas_NotifyTheirOwnChannel(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, inbox.Migrations("a"), inbox.Migrations("b"))
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, s := range []string{"a", "b"} {
		if _, err := conn.Exec(ctx, `LISTEN "`+inbox.NotifyChannel(s)+`"`); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"b", "a"} {
		store, err := inbox.NewStore(pool, nil, inbox.WithSchema(s))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Ingest(ctx, []inbox.Message{msg("e-"+s, "k", "p")}); err != nil {
			t.Fatal(err)
		}
		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := conn.Conn().WaitForNotification(waitCtx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if n.Channel != s+".inbox" {
			t.Fatalf("insert into schema %s notified channel %q, want %q", s, n.Channel, s+".inbox")
		}
	}
	if got := inbox.NotifyChannel(""); got != "public.inbox" {
		t.Errorf("default channel %q", got)
	}
}

// WithAudit routes the operator audit into the service's own log, in the
// transaction of the action: a failing audit undoes the replay.
func TestWithAudit_OneAuditLogPerService(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE service_audit (action text, actor text, ticket text, affected int)`); err != nil {
		t.Fatal(err)
	}
	refuse := false
	ops, err := inbox.NewOps(b.pool, inbox.WithAudit(func(ctx context.Context, tx pgx.Tx, rec inbox.AuditRecord) error {
		if refuse {
			return errors.New("audit log unavailable")
		}
		_, err := tx.Exec(ctx, `INSERT INTO service_audit VALUES ($1, $2, $3, $4)`, rec.Action, rec.Actor, rec.Ticket, rec.Affected)
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	p := msg("pubsub-message:9", "", "x")
	p.ParkReason, p.ParkError = inbox.ReasonPoison, "unparseable"
	if _, err := b.store.Ingest(ctx, []inbox.Message{p}); err != nil {
		t.Fatal(err)
	}
	auth := inbox.Authorization{Ticket: "INC-3", Actor: "erin"}
	refuse = true
	if _, err := ops.Replay(ctx, inbox.ReplayRequest{Authorization: auth, IDs: []int64{1}}); err == nil {
		t.Fatal("replay succeeded although its audit failed")
	}
	if e, _ := b.ops.Get(ctx, 1); e.Status != inbox.StatusParked {
		t.Fatalf("a replay whose audit failed reopened the entry: %+v", e)
	}
	refuse = false
	if _, err := ops.Replay(ctx, inbox.ReplayRequest{Authorization: auth, IDs: []int64{1}}); err != nil {
		t.Fatal(err)
	}
	if e, _ := b.ops.Get(ctx, 1); e.Status != inbox.StatusOpen {
		t.Fatalf("replayed entry: %+v", e)
	}
	if n := b.count(t, `SELECT count(*) FROM service_audit WHERE action = 'inbox.replay' AND actor = 'erin' AND ticket = 'INC-3' AND affected = 1`); n != 1 {
		t.Fatalf("service audit rows = %d, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox_audit`); n != 0 {
		t.Fatalf("inbox_audit rows = %d, want 0: the service's log replaces it", n)
	}
}

// A handler error marked permanent parks the entry at its first attempt.
func TestPermanentError_ParksAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.store.Ingest(ctx, []inbox.Message{msg("e1", "k", "p")}); err != nil {
		t.Fatal(err)
	}
	h := inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Entry) error {
		return permanent.Mark(errors.New("stored payload does not decode"))
	})
	drain(t, b.relay(t, h, inbox.Config{}))
	e, err := b.ops.Get(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != inbox.StatusParked || e.ParkReason != inbox.ReasonPermanent || e.Attempts != 1 || e.LastError != "stored payload does not decode" {
		t.Fatalf("want PARKED %s after one attempt, got %+v", inbox.ReasonPermanent, e)
	}
}
