package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/outbox"
)

// The dependency refuses every dispatch: after CircuitThreshold refusals the
// relay stops dispatching, charges nobody, probes once per probe interval,
// and once a probe goes through sends every waiting event in the next claim.
func TestDependencyOutage_EventsNotChargedAndSentOnceAProbeSucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var down atomic.Bool
	var calls atomic.Int64
	down.Store(true)
	b.rec.fn = func(outbox.Event) (outbox.Commit, error) {
		calls.Add(1)
		if down.Load() {
			return nil, outbox.Unavailable(errors.New("connection refused"))
		}
		return nil, nil
	}
	r := b.relay(t, b.pool, outbox.Config{DispatchConcurrency: 1, CircuitThreshold: 3, CircuitProbeInterval: time.Second, CircuitProbeIntervalMax: 2 * time.Second,
		BackoffBase: time.Minute, BackoffMax: time.Hour})
	var evs []outbox.Event
	for i := range 10 {
		evs = append(evs, event(fmt.Sprintf("agg-%d", i), 1))
	}
	appendCommitted(t, b.pool, evs...)

	processBatch(t, r)
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d dispatches while the dependency refused, want 3 (the threshold, then the circuit opened)", n)
	}
	assertUntouched := func(when string) {
		t.Helper()
		for _, ev := range evs {
			var attempts int
			var next *time.Time
			if err := b.pool.QueryRow(context.Background(), `SELECT attempts, next_attempt_at FROM outbox WHERE event_id = $1 AND status = 'PENDING'`, ev.ID).
				Scan(&attempts, &next); err != nil {
				t.Fatalf("%s: event %s: %v", when, ev.AggregateID, err)
			}
			if attempts != 0 || next != nil {
				t.Fatalf("%s: event %s has %d attempts and next_attempt_at %v, want untouched (an outage is not the event's fault)", when, ev.AggregateID, attempts, next)
			}
		}
	}
	assertUntouched("circuit opened")

	// Open: nothing is claimed or dispatched until the probe time.
	b.clock.Advance(999 * time.Millisecond)
	processBatch(t, r)
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d dispatches, want none while the circuit is open", n-3)
	}
	// Probe time: one dispatch, refused; the next probe is 2 s later.
	b.clock.Advance(time.Millisecond)
	processBatch(t, r)
	b.clock.Advance(1999 * time.Millisecond)
	processBatch(t, r)
	if n := calls.Load(); n != 4 {
		t.Fatalf("%d dispatches, want 4 (threshold, then one probe)", n)
	}
	assertUntouched("probe refused")

	// The dependency is back: the next probe succeeds, closes the circuit
	// and the relay takes every waiting event in its next claim, not after
	// any backoff (the clock stands still from here on).
	down.Store(false)
	b.clock.Advance(time.Millisecond)
	processBatch(t, r)
	processBatch(t, r)
	if n := countStatus(t, b.pool, "PUBLISHED"); n != len(evs) {
		t.Fatalf("%d of %d events published after the probe succeeded, want all", n, len(evs))
	}
	for _, ev := range evs {
		if got := rowOf(t, b.pool, ev.ID); got.Attempts != 1 {
			t.Errorf("event %s published with %d attempts, want 1", ev.AggregateID, got.Attempts)
		}
	}
}

// A poison event (its own dispatch fails, not the dependency) keeps backing
// off and ends FAILED at MaxAttempts, while the other events of the same
// dependency flow: its failures are not the dependency's and do not open
// the circuit.
func TestPoisonEvent_BacksOffToFailedWhileTheCircuitStaysClosed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	poison := event("poison", 1)
	b.rec.fn = func(ev outbox.Event) (outbox.Commit, error) {
		if ev.ID == poison.ID {
			return nil, errors.New("provider answered INTERNAL for this order")
		}
		return nil, nil
	}
	const maxAttempts = 4
	r := b.relay(t, b.pool, outbox.Config{DispatchConcurrency: 1, CircuitThreshold: 2, MaxAttempts: maxAttempts,
		BackoffBase: time.Second, BackoffMax: time.Second})
	appendCommitted(t, b.pool, poison)
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		// Fresh events with every attempt: if the poison's failures opened
		// the circuit, they would stay unclaimed.
		fresh := []outbox.Event{event(fmt.Sprintf("a-%d", attempt), 1), event(fmt.Sprintf("b-%d", attempt), 1)}
		appendCommitted(t, b.pool, fresh...)
		b.clock.Advance(time.Second) // the poison's backoff (full jitter, at most 1 s) is over
		processBatch(t, r)
		for _, ev := range fresh {
			if got := rowOf(t, b.pool, ev.ID); got.Status != "PUBLISHED" {
				t.Fatalf("attempt %d: event of %s is %+v, want PUBLISHED (the circuit must stay closed)", attempt, ev.AggregateID, got)
			}
		}
		got := rowOf(t, b.pool, poison.ID)
		if got.Attempts != attempt {
			t.Fatalf("attempt %d: poison has %d attempts charged", attempt, got.Attempts)
		}
		if attempt < maxAttempts {
			var next *time.Time
			if err := b.pool.QueryRow(context.Background(), `SELECT next_attempt_at FROM outbox WHERE event_id = $1`, poison.ID).Scan(&next); err != nil {
				t.Fatal(err)
			}
			if got.Status != "PENDING" || next == nil {
				t.Fatalf("attempt %d: poison is %s with next_attempt_at %v, want PENDING and backing off", attempt, got.Status, next)
			}
		}
	}
	if got := rowOf(t, b.pool, poison.ID); got.Status != "FAILED" || got.LastError == nil {
		t.Fatalf("poison after %d attempts: %+v, want FAILED with its error", maxAttempts, got)
	}
}
