package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/internal/devtools/loadgen"
	"github.com/lossless-dev/lossless/internal/devtools/localstack"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// chaosAttr marks the messages the chaos test publishes itself, so a dead
// letter can be told apart from a good message.
const chaosAttr = "lossless_chaos"

// badMessage is one message published straight to a topic that its consumer
// must park (with a reason), never nack forever or dead-letter.
type badMessage struct {
	label string // what is wrong with it
	topic string
	data  []byte
	attrs map[string]string
	id    string // Pub/Sub message id, once published
}

// TestChaos_TwoReplicasKillsBadMessagesAndAPostgresRestart runs two replicas
// of every service with every provider fault on, under a steady load of
// orders; mid-load it publishes malformed messages straight to the topics,
// SIGKILLs one replica of each service at different moments (each restarts)
// and crash-restarts PostgreSQL. Then every accepted order must be invoiced
// exactly once with the right amount, every malformed message parked with a
// reason, no good message dead-lettered, and nothing left open or leased.
func TestChaos_TwoReplicasKillsBadMessagesAndAPostgresRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds and runs every service")
	}
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	binDir := buildServices(ctx, t)
	const replicas = 2
	ports, err := localstack.FreePortsFor(replicas)
	if err != nil {
		t.Fatal(err)
	}
	logw := &lockedWriter{w: new(bytes.Buffer)}
	// Its own PostgreSQL cluster (no DatabaseURL): the test crashes it.
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir:   binDir,
		Ports:    ports,
		Replicas: replicas,
		Log:      logw,
		ExtraEnv: map[string][]string{
			"provider-sim": {
				"PROVIDER_FAULT_DUPLICATE=0.2",
				"PROVIDER_FAULT_EARLY_COMPLETION=0.2",
				"PROVIDER_FAULT_SPLIT_COMPLETION=0.2",
				"PROVIDER_FAULT_POISON=0.05",
				"PROVIDER_FAULT_UNKNOWN_ORDER=0.05",
				"PROVIDER_FAULT_PUBLISH_THEN_CRASH=0.02",
				"PROVIDER_FAULT_SEED=7",
				"PROVIDER_EXEC_BASE=20ms",
				"PROVIDER_EXEC_PER_POSITION=1ms",
				"PROVIDER_POLL_INTERVAL=50ms",
				// A killed replica's jobs are taken over after this.
				"PROVIDER_LEASE=3s",
			},
			"workorder": {
				// As in the end-to-end test, with room for the hand-offs
				// delayed by a killed provider replica and the restart of
				// PostgreSQL: an early completion (F5) must not park as
				// NOT_WAITING before its order is handed off.
				"WORKORDER_INBOX_MAX_ATTEMPTS=8",
				"WORKORDER_INBOX_MAX_AGE=40s",
				"WORKORDER_INBOX_DEFER_BACKOFF_BASE=100ms",
				"WORKORDER_INBOX_DEFER_BACKOFF_MAX=1s",
				"WORKORDER_OUTBOX_BACKOFF_MAX=1s",
			},
			"billing": {
				// A killed replica's invoice jobs are taken over after this.
				"BILLING_JOBS_LEASE=3s",
				"BILLING_JOBS_POLL_INTERVAL=200ms",
				"BILLING_OUTBOX_BACKOFF_MAX=1s",
			},
		},
	})
	if err != nil {
		t.Fatalf("start stack: %v\n%s", err, tail(logw.String(), 20000))
	}
	t.Cleanup(func() {
		_ = stack.Stop(20 * time.Second)
		if t.Failed() {
			t.Logf("process logs (tail):\n%s", tail(logw.String(), 30000))
		}
	})
	t.Logf("chaos: stack of %d replicas up after %s", replicas, time.Since(started).Round(time.Millisecond))

	// Steady load through both work-order replicas. A create that meets a
	// killed replica or the PostgreSQL restart is retried with its
	// Idempotency-Key; only accepted orders count.
	type outcome struct {
		res *loadgen.Result
		err error
	}
	wos := stack.Replicas("workorder")
	done := make(chan outcome, len(wos))
	for i, in := range wos {
		go func() {
			res, err := loadgen.Run(ctx, loadgen.Config{HTTP: callerHTTP(t, stack, 10*time.Second),
				BaseURL: in.URL, Rate: 3, Duration: 25 * time.Second, Concurrency: 8, MaxPositions: 20,
				Wait: 4 * time.Minute, Seed: uint64(11 + i), CreateRetry: 2 * time.Minute,
			})
			done <- outcome{res, err}
		}()
	}

	woDSN, billingDSN := stack.DSN["workorder"], stack.DSN["billing"]
	// Counting during the chaos tolerates the PostgreSQL restart: -1 on
	// error; the pools replace the connections the restart broke.
	chaosWO, chaosBilling := openDB(t, woDSN), openDB(t, billingDSN)
	orders := func() int { return tryCount(ctx, chaosWO, "SELECT count(*) FROM work_orders") }
	invoices := func() int { return tryCount(ctx, chaosBilling, "SELECT count(*) FROM invoices") }
	var events []chaosEvent // the faults injected, for the tail's table
	kill := func(name string) {
		t.Helper()
		p := stack.Process(name)
		before := p.Restarts()
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		events = append(events, chaosEvent{"SIGKILL " + name, time.Now()})
		t.Logf("chaos: SIGKILL %s at %s", name, time.Since(started).Round(time.Millisecond))
		waitfor.Condition(t, 2*time.Minute, name+" restarted and ready", func() bool {
			return p.Restarts() > before && stack.WaitReady(ctx, name) == nil
		})
	}

	waitfor.Condition(t, 3*time.Minute, "first invoices issued", func() bool { return invoices() >= 5 })
	bad := publishBadMessages(ctx, t, stack)
	t.Logf("chaos: %d bad messages published at %s", len(bad), time.Since(started).Round(time.Millisecond))

	waitfor.Condition(t, 2*time.Minute, "20 orders created", func() bool { return orders() >= 20 })
	kill("provider-sim-2")
	waitfor.Condition(t, 2*time.Minute, "15 invoices issued", func() bool { return invoices() >= 15 })
	kill("billing-1")
	waitfor.Condition(t, 2*time.Minute, "45 orders created", func() bool { return orders() >= 45 })
	kill("workorder-2")
	waitfor.Condition(t, 2*time.Minute, "75 orders created", func() bool { return orders() >= 75 })
	events = append(events, chaosEvent{"PostgreSQL crash and restart", time.Now()})
	if err := stack.RestartPostgres(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("chaos: PostgreSQL crashed and restarted at %s", time.Since(started).Round(time.Millisecond))

	var accepted []string
	for range wos {
		out := <-done
		if out.err != nil {
			t.Fatal(out.err)
		}
		if out.res.CreateErrors != 0 {
			t.Errorf("load: %d orders not accepted within the retry budget", out.res.CreateErrors)
		}
		accepted = append(accepted, out.res.OrderIDs...)
	}
	t.Logf("chaos: load done at %s: %d orders accepted", time.Since(started).Round(time.Millisecond), len(accepted))

	// Fresh pools: the ones of the chaos phase saw the restart.
	wo := openDB(t, woDSN)
	billing := openDB(t, billingDSN)
	provider := openDB(t, stack.DSN["providersim"])

	// Every accepted order INVOICED, once, for positions × unit price, with
	// the invoice the work-order service recorded; retried creates made no
	// second order and malformed messages no invoice.
	checkInvoicedOnce(ctx, t, accepted, wo, billing, provider)
	// An order can be INVOICED before its provider job records that it
	// published the completion: an owner that lost its lease (a kill, the
	// restart) leaves that to the next owner, which republishes after the
	// lease expires. The tail reads published_at, so it waits for every job.
	waitfor.Value(t, time.Minute, "provider-sim: unfinished jobs", 0, func() int {
		return count(t, provider, "SELECT count(*) FROM jobs WHERE status <> 'DONE'")
	})
	tailReport(ctx, t, wo, provider, billing, accepted, events)
	if n := count(t, wo, "SELECT count(*) FROM work_orders"); n != len(accepted) {
		t.Errorf("work orders = %d, want the %d accepted (a retried create made a second order)", n, len(accepted))
	}
	if n := count(t, billing, "SELECT count(*) FROM invoices"); n != len(accepted) {
		t.Errorf("invoices = %d, want %d: one per accepted order, none for a malformed message", n, len(accepted))
	}

	// Every malformed message parked with its reason, in the consumer's
	// own table. The deadline covers the redelivery backoff of a batch
	// that was nacked before the message was isolated.
	badIDs := map[string]bool{}
	for _, b := range bad {
		badIDs[b.id] = true
	}
	var unparked []string
	if !waitfor.Until(2*time.Minute, func() bool {
		unparked = unparked[:0]
		for _, b := range bad {
			if reason := parkedReason(ctx, t, wo, billing, b); reason == "" {
				unparked = append(unparked, b.topic+": "+b.label+" (message "+b.id+")")
			}
		}
		return len(unparked) == 0
	}) {
		dumpBadMessageState(ctx, t, wo, billing, bad)
		t.Errorf("malformed messages not parked with a reason:\n  %s", strings.Join(unparked, "\n  "))
	}
	for _, b := range bad {
		if reason := parkedReason(ctx, t, wo, billing, b); reason != "" {
			t.Logf("parked: %s: %s -> %s", b.topic, b.label, reason)
		}
	}
	// Besides ours, the workorder inbox parks only what the provider's
	// faults produce (F8, F9); billing parks only ours.
	rows, err := wo.Query(ctx, "SELECT message_id, park_reason FROM inbox WHERE status = 'PARKED'")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var msgID, reason string
		if err := rows.Scan(&msgID, &reason); err != nil {
			t.Fatal(err)
		}
		if !badIDs[msgID] && reason != "POISON" && reason != "UNKNOWN_ORDER" {
			t.Errorf("inbox: provider message %s parked as %s: a good message parked", msgID, reason)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n, want := count(t, billing, "SELECT count(*) FROM parked_messages"), countTopic(bad, topology.TopicWorkOrderEvents); n != want {
		t.Errorf("billing: %d parked messages, want the %d malformed ones", n, want)
	}

	// Nothing dead-lettered but (at worst) our own malformed messages.
	for _, sub := range []string{topology.SubWorkOrderCompletedDeadLetter, topology.SubWorkOrderEventsDeadLetter, topology.SubBillingEventsDeadLetter} {
		for _, m := range peekDeadLetters(ctx, t, stack, sub) {
			if m.GetAttributes()[chaosAttr] == "" {
				t.Errorf("%s: good message dead-lettered: event %s (%s)", sub, m.GetAttributes()[pubsub.AttrEventID], m.GetAttributes()[pubsub.AttrEventType])
			} else {
				t.Errorf("%s: malformed message dead-lettered instead of parked: %s", sub, m.GetAttributes()[chaosAttr])
			}
		}
	}

	// Nothing open, claimed or leased.
	waitfor.Value(t, time.Minute, "open inbox entries", 0, func() int {
		return count(t, wo, "SELECT count(*) FROM inbox WHERE status = 'OPEN'")
	})
	for name, db := range map[string]*pgxpool.Pool{"workorder": wo, "billing": billing} {
		waitfor.Value(t, time.Minute, name+": undelivered outbox events", 0, func() int {
			return count(t, db, "SELECT count(*) FROM outbox")
		})
	}
	if n := count(t, billing, "SELECT count(*) FROM leasequeue_jobs WHERE state <> 'done'"); n != 0 {
		t.Errorf("billing: %d invoice jobs not done", n)
	}

	if err := stack.StopServices(30 * time.Second); err != nil {
		t.Errorf("graceful shutdown: %v", err)
	}
	if n := count(t, billing, "SELECT count(*) FROM leasequeue_jobs WHERE state = 'running'"); n != 0 {
		t.Errorf("billing: %d jobs still leased after shutdown", n)
	}
	if n := count(t, provider, "SELECT count(*) FROM jobs WHERE lease_until > now()"); n != 0 {
		t.Errorf("provider-sim: %d jobs still leased after shutdown", n)
	}
	t.Logf("chaos: %d orders invoiced exactly once, %d malformed messages parked; wall time %s",
		len(accepted), len(bad), time.Since(started).Round(time.Millisecond))
}

// publishBadMessages publishes, straight to the topics, messages whose
// consumer must park them: text the database rejects (a NUL byte in an id or
// in an attribute, which PostgreSQL cannot store in text or jsonb), an id
// longer than the 200 characters the tables allow, an event type nobody
// consumes, a message without an event type.
func publishBadMessages(ctx context.Context, t *testing.T, stack *localstack.Stack) []badMessage {
	t.Helper()
	completed := func(eventID string) []byte {
		b, err := proto.Marshal(&eventsv1.WorkOrderCompleted{
			EventId: eventID, WorkOrderId: uuid.NewString(), CompletedItems: 1, CompletedAt: timestamppb.Now(),
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	recorded := func(eventID string) []byte {
		b, err := proto.Marshal(&eventsv1.WorkOrderCompletionRecorded{
			EventId: eventID, WorkOrderId: uuid.NewString(), CustomerId: "chaos", Description: "malformed",
			Positions: 1, CompletedItems: 1, UnitPrice: &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 100},
			CompletedAt: timestamppb.Now(),
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	attrs := func(label, eventType, eventID string) map[string]string {
		a := map[string]string{chaosAttr: label, pubsub.AttrSchemaVersion: "1"}
		if eventType != "" {
			a[pubsub.AttrEventType] = eventType
		}
		if eventID != "" {
			a[pubsub.AttrEventID] = eventID
		}
		return a
	}
	const (
		typeCompleted = "lossless.events.v1.WorkOrderCompleted"
		typeRecorded  = "lossless.events.v1.WorkOrderCompletionRecorded"
	)
	nulID := "chaos-\x00-" + uuid.NewString()
	longID := strings.Repeat("x", 250)
	freshID := func() string { return "chaos-" + uuid.NewString() }
	withNulAttr := func(a map[string]string) map[string]string { a["note"] = "nul\u0000byte"; return a }

	id1, id2 := freshID(), freshID()
	bad := []badMessage{
		{label: "event_id with a NUL byte", topic: topology.TopicWorkOrderCompleted, data: completed(nulID), attrs: attrs("nul-event-id", typeCompleted, nulID)},
		{label: "attribute value with a NUL byte", topic: topology.TopicWorkOrderCompleted, data: completed(id1), attrs: withNulAttr(attrs("nul-attribute", typeCompleted, id1))},
		{label: "250-character event_id", topic: topology.TopicWorkOrderCompleted, data: completed(longID), attrs: attrs("long-event-id", typeCompleted, longID)},
		{label: "unknown event_type", topic: topology.TopicWorkOrderCompleted, data: completed(freshID()), attrs: attrs("unknown-type", "lossless.events.v1.NoSuchEvent", "")},

		{label: "event_id with a NUL byte", topic: topology.TopicWorkOrderEvents, data: recorded(nulID), attrs: attrs("nul-event-id", typeRecorded, nulID)},
		{label: "unparseable payload with a NUL byte in an attribute value", topic: topology.TopicWorkOrderEvents, data: []byte("not a protobuf \xff\xff"), attrs: withNulAttr(attrs("nul-attribute", typeRecorded, id2))},
		{label: "250-character event_id", topic: topology.TopicWorkOrderEvents, data: recorded(longID), attrs: attrs("long-event-id", typeRecorded, longID)},
		{label: "no event_type", topic: topology.TopicWorkOrderEvents, data: recorded(freshID()), attrs: attrs("no-type", "", "")},
		{label: "unknown event_type", topic: topology.TopicWorkOrderEvents, data: recorded(freshID()), attrs: attrs("unknown-type", "lossless.events.v1.NoSuchEvent", "")},
	}
	client, err := pubsub.NewClient(ctx, pubsub.ClientConfig{ProjectID: "lossless-local", EmulatorHost: stack.Emulator})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	pubs := map[string]*pubsub.Publisher{}
	for i := range bad {
		p := pubs[bad[i].topic]
		if p == nil {
			if p, err = pubsub.NewPublisher(client, bad[i].topic, pubsub.DefaultPublisherConfig()); err != nil {
				t.Fatal(err)
			}
			pubs[bad[i].topic] = p
		}
		if bad[i].id, err = p.PublishRaw(ctx, bad[i].data, bad[i].attrs, ""); err != nil {
			t.Fatalf("publish %s to %s: %v", bad[i].label, bad[i].topic, err)
		}
	}
	for _, p := range pubs {
		p.Stop()
	}
	return bad
}

// parkedReason returns the reason a malformed message is parked under in
// its consumer's table, "" while it is not parked.
func parkedReason(ctx context.Context, t *testing.T, wo, billing *pgxpool.Pool, b badMessage) string {
	t.Helper()
	var reason string
	var err error
	switch b.topic {
	case topology.TopicWorkOrderCompleted:
		err = wo.QueryRow(ctx, `SELECT coalesce(park_reason, '') || ': ' || coalesce(last_error, '')
			FROM inbox WHERE message_id = $1 AND status = 'PARKED' AND park_reason <> ''`, b.id).Scan(&reason)
	case topology.TopicWorkOrderEvents:
		err = billing.QueryRow(ctx, `SELECT reason FROM parked_messages
			WHERE subscription = $1 AND message_id = $2 AND reason <> ''`, topology.SubWorkOrderEvents, b.id).Scan(&reason)
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("parked %s: %v", b.label, err)
	}
	return reason
}

// dumpBadMessageState logs what each consumer holds about the malformed
// messages, and its latest intake errors, for a failure report.
func dumpBadMessageState(ctx context.Context, t *testing.T, wo, billing *pgxpool.Pool, bad []badMessage) {
	t.Helper()
	for _, b := range bad {
		var q string
		db := wo
		if b.topic == topology.TopicWorkOrderCompleted {
			q = `SELECT status || ' ' || coalesce(park_reason, '-') || ' ' || coalesce(last_error, '') FROM inbox WHERE message_id = $1`
		} else {
			db, q = billing, `SELECT reason FROM parked_messages WHERE message_id = $1`
		}
		var state string
		if err := db.QueryRow(ctx, q, b.id).Scan(&state); err != nil {
			state = "no row (" + err.Error() + ")"
		}
		t.Logf("bad message %s on %s (message %s): %s", b.label, b.topic, b.id, state)
	}
}

// peekDeadLetters pulls what waits on a dead-letter inspection subscription
// and releases it again (nack), as the dead-letter monitor does.
func peekDeadLetters(ctx context.Context, t *testing.T, stack *localstack.Stack, sub string) []*pubsubpb.PubsubMessage {
	t.Helper()
	client, err := pubsub.NewClient(ctx, pubsub.ClientConfig{ProjectID: "lossless-local", EmulatorHost: stack.Emulator})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	name := fmt.Sprintf("projects/%s/subscriptions/%s", "lossless-local", sub)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := client.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{Subscription: name, MaxMessages: 1000})
	if status.Code(err) == codes.DeadlineExceeded {
		return nil
	}
	if err != nil {
		t.Fatalf("pull %s: %v", sub, err)
	}
	var out []*pubsubpb.PubsubMessage
	var ackIDs []string
	for _, rm := range resp.GetReceivedMessages() {
		out = append(out, rm.GetMessage())
		ackIDs = append(ackIDs, rm.GetAckId())
	}
	if len(ackIDs) > 0 {
		_ = client.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: name, AckIds: ackIDs})
	}
	return out
}

func countTopic(bad []badMessage, topic string) int {
	n := 0
	for _, b := range bad {
		if b.topic == topic {
			n++
		}
	}
	return n
}

// tryCount runs a count, -1 when the database cannot answer (it is being
// restarted).
func tryCount(ctx context.Context, pool *pgxpool.Pool, q string, args ...any) int {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int
	if err := pool.QueryRow(qctx, q, args...).Scan(&n); err != nil {
		return -1
	}
	return n
}
