package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/pkg/inbox"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pgtext"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// One message the database rejects must not take its batch down: the
// rejected message is stored PARKED (raw payload kept) and its batch-mates
// are stored OPEN, all in one Ingest that returns nil (everything may be
// acked).
func TestIngest_RejectedMessageIsParkedBatchMatesStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	type bad struct {
		m         inbox.Message
		key       string // the event id it is stored under
		wantError string // what its park error must name
	}
	nul := msg("nul\x00id", "k-nul", "p-nul")
	nul.MessageID = "m-nul"
	badUTF8 := msg("bad\xffid", "k-utf8", "p-utf8")
	badUTF8.MessageID = "m-utf8"
	long := msg(strings.Repeat("x", 201), "k-long", "p-long")
	long.MessageID = "m-long"
	nulAttr := msg("nul-attr", "k-nulattr", "p-nulattr")
	nulAttr.Attributes = map[string]string{"note": "a\x00b", "event_id": "nul-attr"}
	badAttrKey := msg("bad-attr-key", "k-badkey", "p-badkey")
	badAttrKey.Attributes = map[string]string{"k\xfe": "v"}
	badTrace := msg("bad-trace", "k-trace", "p-trace")
	badTrace.Traceparent = "00-\x00"
	bads := []bad{
		{nul, "pubsub-message:m-nul", "event_id"},
		{badUTF8, "pubsub-message:m-utf8", "event_id"},
		{long, "pubsub-message:m-long", "event_id"},
		{nulAttr, "nul-attr", `attribute "note"`},
		{badAttrKey, "bad-attr-key", `attribute "k\xfe"`},
		{badTrace, "bad-trace", "traceparent"},
	}
	var batch []inbox.Message
	for i := range 10 {
		batch = append(batch, msg(fmt.Sprintf("good-%d", i), fmt.Sprintf("k%d", i), "p"))
		if i < len(bads) {
			batch = append(batch, bads[i].m)
		}
	}
	res, err := b.store.Ingest(ctx, batch)
	if err != nil {
		t.Fatalf("a data error of one message must not fail the batch: %v", err)
	}
	if res.Inserted != 10 || res.Poison != len(bads) || res.Rejected != len(bads) {
		t.Fatalf("result %+v, want 10 inserted and %d poison, all rejected by the database", res, len(bads))
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE event_id LIKE 'good-%' AND status = 'OPEN'`); n != 10 {
		t.Fatalf("good messages stored OPEN = %d, want 10", n)
	}
	for _, c := range bads {
		var status, reason, lastErr, payload string
		var attrs map[string]string
		err := b.pool.QueryRow(ctx, `SELECT status, park_reason, last_error, convert_from(payload, 'UTF8'), attributes
			FROM inbox WHERE source = 'test' AND event_id = $1`, c.key).Scan(&status, &reason, &lastErr, &payload, &attrs)
		if err != nil {
			t.Fatalf("%q: not stored under %q: %v", c.m.EventID, c.key, err)
		}
		if status != "PARKED" || reason != inbox.ReasonPoison || payload != string(c.m.Payload) {
			t.Errorf("%q: status %s reason %s payload %q, want PARKED POISON with the raw payload", c.m.EventID, status, reason, payload)
		}
		if !strings.Contains(lastErr, "not storable as received") || !strings.Contains(lastErr, pgtext.Storable(c.wantError)) {
			t.Errorf("%q: park error %q does not name %q", c.m.EventID, lastErr, c.wantError)
		}
		if len(attrs) != len(c.m.Attributes) {
			t.Errorf("%q: attributes %v, want all %d kept (escaped)", c.m.EventID, attrs, len(c.m.Attributes))
		}
	}
	// The NUL attribute is kept, escaped, and the escape is reversible (pkg/pgtext).
	var note string
	if err := b.pool.QueryRow(ctx, `SELECT attributes->>'note' FROM inbox WHERE event_id = 'nul-attr'`).Scan(&note); err != nil {
		t.Fatal(err)
	}
	if note != `a\x00b` {
		t.Fatalf("escaped attribute = %q", note)
	}

	// Redelivery of the same batch: every message, rejected ones included,
	// is a duplicate; nothing new is stored.
	res, err = b.store.Ingest(ctx, batch)
	if err != nil || res.Duplicates != len(batch) || res.Inserted+res.Poison+res.Conflicts != 0 {
		t.Fatalf("redelivery: %+v %v", res, err)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox`); n != 10+len(bads) {
		t.Fatalf("rows after redelivery = %d, want %d", n, 10+len(bads))
	}
}

// A rule the store does not know about (here a CHECK constraint added to
// the test database: live entries carry no payload over 1 kB) rejects one
// message of the batch statement: the batch is stored again one message per
// savepoint, the rejected message is parked with the database's error, and
// its batch-mates are stored.
func TestIngest_UnknownDataRuleIsolatesTheMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `ALTER TABLE inbox ADD CONSTRAINT test_live_payload_small CHECK (status <> 'OPEN' OR length(payload) <= 1000)`); err != nil {
		t.Fatal(err)
	}
	big := msg("big", "k", strings.Repeat("x", 1001))
	batch := []inbox.Message{msg("a", "k", "p"), big, msg("c", "k", "p"), msg("a", "k", "other")}
	res, err := b.store.Ingest(ctx, batch)
	if err != nil {
		t.Fatalf("a data error of one message must not fail the batch: %v", err)
	}
	if res.Inserted != 2 || res.Poison != 1 || res.Rejected != 1 || res.Conflicts != 1 {
		t.Fatalf("result %+v, want 2 inserted, 1 parked by the store, 1 conflict", res)
	}
	var status, reason, lastErr string
	if err := b.pool.QueryRow(ctx, `SELECT status, park_reason, last_error FROM inbox WHERE event_id = 'big' AND length(payload) = 1001`).Scan(&status, &reason, &lastErr); err != nil {
		t.Fatal(err)
	}
	if status != "PARKED" || reason != inbox.ReasonPoison || !strings.Contains(lastErr, "rejected by the database") || !strings.Contains(lastErr, "test_live_payload_small") {
		t.Fatalf("big: %s %s %q", status, reason, lastErr)
	}
	if n := b.count(t, `SELECT count(*) FROM inbox WHERE event_id IN ('a', 'c') AND status = 'OPEN'`); n != 2 {
		t.Fatalf("batch-mates stored = %d, want 2", n)
	}
	// Ids still follow receipt order on this path.
	if n := b.count(t, `SELECT count(*) FROM inbox x JOIN inbox y ON x.event_id = 'a' AND y.event_id = 'c' WHERE x.id < y.id`); n != 1 {
		t.Fatal("ids must follow receipt order")
	}
}

// Already-poison messages rejected by the database keep their own reason
// and error; the store adds why it had to escape.
func TestIngest_RejectedPoisonKeepsItsReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	p := msg("p\x00", "", "raw")
	p.ParkReason, p.ParkError = "CUSTOM", "decoder said no"
	if _, err := b.store.Ingest(ctx, []inbox.Message{p, msg("ok", "k", "p")}); err != nil {
		t.Fatal(err)
	}
	var reason, lastErr string
	if err := b.pool.QueryRow(ctx, `SELECT park_reason, last_error FROM inbox WHERE event_id = $1`, inbox.PoisonKey("m-p\x00")).Scan(&reason, &lastErr); err != nil {
		t.Fatal(err)
	}
	if reason != "CUSTOM" || !strings.Contains(lastErr, "decoder said no") || !strings.Contains(lastErr, "event_id") {
		t.Fatalf("reason %q error %q", reason, lastErr)
	}
}

// Errors that are not about a message's data fail the whole batch: nothing
// is stored, so nothing may be acked.
func TestIngest_InfrastructureErrorsFailTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := []inbox.Message{msg("e1", "k", "p"), msg("bad\x00", "k", "p")}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.store.Ingest(ctx, batch); err == nil {
		t.Fatal("cancelled context: want an error")
	}

	pool, err := pgxpool.New(context.Background(), pgtest.NewDatabase(t, inbox.Migrations("")))
	if err != nil {
		t.Fatal(err)
	}
	closed, err := inbox.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	if _, err := closed.Ingest(context.Background(), batch); err == nil {
		t.Fatal("closed pool: want an error")
	}
	if n := b.count(t, `SELECT count(*) FROM inbox`); n != 0 {
		t.Fatalf("rows = %d, want none after failed batches", n)
	}
}

// Rows are inserted in key order (deadlock freedom) but their ids still
// follow receipt order: the relay's "older" is "lower id" (I4).
func TestIngest_IdsFollowReceiptOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	keys := []string{"m", "c", "x", "a", "q", "b"}
	for i := 60; i > 0; i-- {
		keys = append(keys, fmt.Sprintf("k%03d", i*7%61))
	}
	var batch []inbox.Message
	for _, k := range keys {
		batch = append(batch, msg(k, "same-order", "p"))
	}
	if _, err := b.store.Ingest(ctx, batch); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(ctx, `SELECT event_id FROM inbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
	}
	if rows.Err() != nil || !slices.Equal(got, keys) {
		t.Fatalf("ids order %v (%v), want receipt order %v", got, rows.Err(), keys)
	}
}

// Concurrent batches with overlapping keys in opposite orders (redeliveries
// racing a fresh delivery) must never deadlock: rows are inserted in one
// canonical key order. Besides "no error and one row per key", the test reads
// the database's own deadlock counter, which a retry would hide.
func TestF4_OppositeOrderBatches_NoDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(t, inbox.Migrations("")))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := inbox.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	const rounds, size = 20, 200
	for round := range rounds {
		fwd := make([]inbox.Message, size)
		for i := range fwd {
			fwd[i] = msg(fmt.Sprintf("r%02d-%03d", round, i), "k"+strconv.Itoa(i%7), "p")
		}
		rev := slices.Clone(fwd)
		slices.Reverse(rev)
		goroutines := 2 + round%3 // 2..4
		start := make(chan struct{})
		errs := make([]error, goroutines)
		var wg sync.WaitGroup
		for g := range goroutines {
			batch := fwd
			if g%2 == 1 {
				batch = rev
			}
			wg.Go(func() {
				<-start
				_, errs[g] = store.Ingest(ctx, batch)
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	var rows, keys int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM inbox`).Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	if rows != rounds*size || keys != rows {
		t.Fatalf("rows %d keys %d, want %d each (one row per key)", rows, keys, rounds*size)
	}
	// A backend flushes its statistics when it exits: close the pool, wait
	// for its sessions to end, then read the counter.
	dsn := cfg.ConnString()
	pool.Close()
	check, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	waitfor.Condition(t, 30*time.Second, "the test's sessions ended", func() bool {
		var n int
		_ = check.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n)
		return n == 0
	})
	var deadlocks int64
	if err := check.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks); err != nil {
		t.Fatal(err)
	}
	if deadlocks != 0 {
		t.Fatalf("the database detected %d deadlocks; concurrent ingests must not form lock cycles", deadlocks)
	}
}
