package parked_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/parked"
	"github.com/lossless-dev/lossless/pkg/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// setup migrates a database with the package's set in schema and returns a
// pool and a Store on it. Tests use the schema "ops" (not the default) where
// they run every query, so an unqualified table name fails them.
func setup(t *testing.T, schema string) (*pgxpool.Pool, *parked.Store) {
	t.Helper()
	pool := pgtest.NewPool(t, parked.Migrations(schema))
	s, err := parked.New(parked.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	return pool, s
}

func count(t *testing.T, db *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func msg(sub, id, reason string) parked.Message {
	return parked.Message{Subscription: sub, MessageID: id, EventID: "evt-" + id, EventType: "t.v1.Done",
		Subject: "order-" + id, Attributes: map[string]string{"event_type": "t.v1.Done"}, Data: []byte{0xff, 0x00, 0x01}, Reason: reason}
}

// Whatever a message carries, its row is stored: text PostgreSQL refuses is
// kept escaped (message id, attributes) or NULL (event id, event type,
// subject), the reason says which, the payload is kept byte for byte, and a
// redelivery is parked once.
func TestParkStoresAnyMessageOnce(t *testing.T) {
	t.Parallel()
	pool, s := setup(t, "ops")
	ctx := context.Background()
	m := parked.Message{Subscription: "billing.events", MessageID: "m\x00\xff", EventID: "evt\x00",
		EventType: "t\xfe", Subject: "order\x00", Attributes: map[string]string{"k\x00": "v\xff", "ok": `a\b`},
		Data: []byte{0x00, 0xff}, Reason: "unparseable payload: \x00"}
	st, err := s.Park(ctx, pool, m)
	if err != nil {
		t.Fatal(err)
	}
	want := `unparseable payload: \x00; stored escaped: attributes, message_id; stored as NULL: event_id, event_type, subject`
	if st.ID == 0 || st.Reason != want {
		t.Fatalf("stored %+v, want a new row with reason %q", st, want)
	}
	var messageID, reason string
	var eventID, eventType, subject *string
	var attrs map[string]string
	var data []byte
	if err := pool.QueryRow(ctx, `SELECT message_id, event_id, event_type, subject, attributes, data, reason
		FROM ops.parked_messages WHERE id = $1`, st.ID).Scan(&messageID, &eventID, &eventType, &subject, &attrs, &data, &reason); err != nil {
		t.Fatal(err)
	}
	if messageID != `m\x00\xff` || eventID != nil || eventType != nil || subject != nil || reason != want {
		t.Errorf("row: message_id %q event_id %v event_type %v subject %v reason %q", messageID, eventID, eventType, subject, reason)
	}
	// Every key and value is escaped when one needs it, so keys cannot collide.
	if len(attrs) != 2 || attrs[`k\x00`] != `v\xff` || attrs["ok"] != `a\\b` {
		t.Errorf("attributes %q", attrs)
	}
	if string(data) != "\x00\xff" {
		t.Errorf("data %x, want 00ff", data)
	}

	again, err := s.Park(ctx, pool, m)
	if err != nil || again.ID != 0 {
		t.Fatalf("redelivery: %+v %v, want nothing stored", again, err)
	}
	// The same message id from another subscription is another message.
	other := m
	other.Subscription = "audit.events"
	if st, err := s.Park(ctx, pool, other); err != nil || st.ID == 0 {
		t.Fatalf("other subscription: %+v %v", st, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM ops.parked_messages`); n != 2 {
		t.Fatalf("rows: %d, want 2", n)
	}
	if _, err := s.Park(ctx, pool, parked.Message{Subscription: "s", MessageID: "x"}); err == nil {
		t.Error("a message without a reason was parked")
	}
}

// Parked in the caller's transaction, the row commits or rolls back with it.
func TestParkInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	pool, s := setup(t, "ops")
	ctx := context.Background()
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Park(ctx, tx, msg("sub", fmt.Sprint("m-", commit), "bad")); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM ops.parked_messages`); n != 1 {
		t.Fatalf("rows: %d, want 1 (the committed one)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM ops.parked_messages WHERE message_id = 'm-true'`); n != 1 {
		t.Fatal("the committed transaction's message is not parked")
	}
}

// List pages through the open messages oldest first, per subscription,
// per subject or all; replayed ones are left out. CountByReason counts the open ones.
func TestListAndCountOpenMessages(t *testing.T) {
	t.Parallel()
	pool, s := setup(t, "ops")
	ctx := context.Background()
	var ids []int64
	for i, sub := range []string{"a", "b", "a", "a", "b"} {
		st, err := s.Park(ctx, pool, msg(sub, fmt.Sprint("m", i), "reason-"+sub))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, st.ID)
	}
	if err := s.Replay(ctx, pool, ids[2], "INC-1", "alice", func(context.Context, pgx.Tx, parked.Parked) error { return nil }); err != nil {
		t.Fatal(err)
	}

	var got []int64
	f := parked.ListFilter{Subscription: "a", Limit: 1}
	for {
		page, err := s.List(ctx, pool, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, p := range page {
			got = append(got, p.ID)
		}
		f.AfterID = page[len(page)-1].ID
	}
	if fmt.Sprint(got) != fmt.Sprint([]int64{ids[0], ids[3]}) {
		t.Errorf("subscription a pages: %v, want %v", got, []int64{ids[0], ids[3]})
	}

	all, err := s.List(ctx, pool, parked.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 {
		t.Fatalf("all open: %d, want 4", len(all))
	}
	p := all[0]
	if p.ID != ids[0] || p.Subscription != "a" || p.MessageID != "m0" || p.EventID != "evt-m0" || p.EventType != "t.v1.Done" ||
		p.Subject != "order-m0" || p.Attributes["event_type"] != "t.v1.Done" || string(p.Data) != "\xff\x00\x01" ||
		p.Reason != "reason-a" || p.ParkedAt.IsZero() {
		t.Errorf("first row %+v", p)
	}
	// By subject: one entity's messages, across subscriptions.
	if bySubject, err := s.List(ctx, pool, parked.ListFilter{Subject: "order-m4"}); err != nil || len(bySubject) != 1 || bySubject[0].ID != ids[4] {
		t.Errorf("by subject: %+v %v, want the one row of order-m4", bySubject, err)
	}
	if _, err := s.List(ctx, pool, parked.ListFilter{Limit: 1001}); err == nil {
		t.Error("a page of 1001 was accepted")
	}

	counts, err := s.CountByReason(ctx, pool, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) != 2 || counts["reason-a"] != 2 || counts["reason-b"] != 2 {
		t.Errorf("counts %v, want reason-a 2, reason-b 2 (the replayed one not counted)", counts)
	}
	counts, err = s.CountByReason(ctx, pool, "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) != 1 || counts["reason-b"] != 2 {
		t.Errorf("counts of b %v", counts)
	}
}

// Replay needs a ticket and an actor; a failing apply changes nothing and
// leaves the row open; concurrent replays of one row apply it once, and the
// row records who replayed it under which ticket.
func TestReplayAppliesOnceAndAudits(t *testing.T) {
	t.Parallel()
	pool, s := setup(t, "ops")
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE ops.effects (message_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	st, err := s.Park(ctx, pool, msg("sub", "m1", "order is HANDED_OFF"))
	if err != nil {
		t.Fatal(err)
	}
	apply := func(ctx context.Context, tx pgx.Tx, p parked.Parked) error {
		_, err := tx.Exec(ctx, `INSERT INTO ops.effects VALUES ($1)`, p.MessageID)
		return err
	}
	if err := s.Replay(ctx, pool, st.ID, " ", "bob", apply); !errors.Is(err, parked.ErrAuditRequired) {
		t.Fatalf("without a ticket: %v", err)
	}
	if err := s.Replay(ctx, pool, st.ID, "INC-7", strings.Repeat("b", 201), apply); err == nil {
		t.Fatal("a 201-character actor was accepted")
	}
	still := errors.New("still HANDED_OFF")
	if err := s.Replay(ctx, pool, st.ID, "INC-7", "bob", func(ctx context.Context, tx pgx.Tx, p parked.Parked) error {
		if err := apply(ctx, tx, p); err != nil {
			return err
		}
		return still
	}); !errors.Is(err, still) {
		t.Fatalf("failing apply: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM ops.effects`); n != 0 {
		t.Fatal("a failed replay left its effect")
	}
	if n := count(t, pool, `SELECT count(*) FROM ops.parked_messages WHERE replayed_at IS NULL`); n != 1 {
		t.Fatal("a failed replay closed the row")
	}

	const replayers = 4
	errs := make([]error, replayers)
	var wg sync.WaitGroup
	for i := range replayers {
		wg.Go(func() { errs[i] = s.Replay(ctx, pool, st.ID, "INC-7", "bob", apply) })
	}
	wg.Wait()
	var ok, notOpen int
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, parked.ErrNotOpen):
			notOpen++
		default:
			t.Errorf("replay: %v", err)
		}
	}
	if ok != 1 || notOpen != replayers-1 {
		t.Fatalf("%d replays applied, %d found it replayed; want 1 and %d", ok, notOpen, replayers-1)
	}
	if n := count(t, pool, `SELECT count(*) FROM ops.effects WHERE message_id = 'm1'`); n != 1 {
		t.Fatalf("effects: %d, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM ops.parked_messages
		WHERE id = $1 AND replayed_at IS NOT NULL AND replayed_by = 'bob' AND ticket = 'INC-7'`, st.ID); n != 1 {
		t.Fatal("replay not recorded with its actor and ticket")
	}
	if err := s.Replay(ctx, pool, 999, "INC-7", "bob", apply); !errors.Is(err, parked.ErrNotOpen) {
		t.Fatalf("unknown id: %v", err)
	}
}

// In a batch transaction, Isolate rolls back only the effects of the message
// the database refuses (naming the rule) or fn refuses (with its reason);
// the batch-mates' effects and the parked rows commit together. An
// infrastructure error is returned, not turned into a park.
func TestIsolateParksTheOffendingMessageOnly(t *testing.T) {
	t.Parallel()
	pool, s := setup(t, "ops")
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE ops.effects (v int CONSTRAINT positive CHECK (v > 0))`); err != nil {
		t.Fatal(err)
	}
	insert := func(v int) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO ops.effects VALUES ($1)`, v)
			return err
		}
	}
	refuse := func(tx pgx.Tx) error {
		if err := insert(2)(tx); err != nil {
			return err
		}
		return parked.Refuse("order is CANCELLED, not COMPLETED")
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i, fn := range []func(pgx.Tx) error{insert(1), insert(-1), refuse, insert(3)} {
			reason, err := parked.Isolate(ctx, tx, fn)
			if err != nil {
				return err
			}
			if reason != "" {
				if _, err := s.Park(ctx, tx, msg("sub", fmt.Sprint("m", i), reason)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM ops.effects`); n != 2 {
		t.Errorf("effects: %d, want 2 (1 and 3)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM ops.effects WHERE v IN (1, 3)`); n != 2 {
		t.Error("the batch-mates' effects did not commit")
	}
	reasons := map[string]string{}
	rows, _ := pool.Query(ctx, `SELECT message_id, reason FROM ops.parked_messages`)
	var id, reason string
	if _, err := pgx.ForEachRow(rows, []any{&id, &reason}, func() error { reasons[id] = reason; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(reasons) != 2 || !strings.Contains(reasons["m1"], `"positive"`) || !strings.Contains(reasons["m1"], "SQLSTATE 23514") ||
		reasons["m2"] != "order is CANCELLED, not COMPLETED" {
		t.Errorf("parked reasons %q", reasons)
	}

	// On a pool, fn gets a transaction of its own: refused, it rolls back.
	if reason, err := parked.Isolate(ctx, pool, refuse); err != nil || reason == "" {
		t.Fatalf("on a pool: %q %v", reason, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM ops.effects WHERE v = 2`); n != 0 {
		t.Error("a refused fn's effect committed")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if reason, err := parked.Isolate(cancelled, pool, insert(5)); err == nil || reason != "" {
		t.Fatalf("cancelled context: reason %q, error %v; want the error", reason, err)
	}
}

// The package works in the default schema too, and refuses a schema name it
// cannot use unquoted.
func TestDefaultSchemaAndWithSchema(t *testing.T) {
	t.Parallel()
	pool, s := setup(t, "")
	ctx := context.Background()
	if _, err := s.Park(ctx, pool, msg("sub", "m1", "bad")); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM public.parked_messages`); n != 1 {
		t.Fatalf("rows in public: %d, want 1", n)
	}
	if _, err := parked.New(parked.WithSchema("Ops")); err == nil || !strings.Contains(err.Error(), "Schema") {
		t.Errorf("schema Ops: %v, want an error naming Schema", err)
	}
}
