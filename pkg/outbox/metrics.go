package outbox

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The relay's instruments (doc.go lists them): counters added as batches
// settle, gauges observed from the last Stats refresh (maintain.go) and the
// circuits' states.

type instruments struct {
	dispatched metric.Int64Counter
	errors     metric.Int64Counter
	failed     metric.Int64Counter
	unsettled  metric.Int64Counter
	circuit    metric.Int64Counter
}

func (r *Relay) initMetrics(meter metric.Meter) error {
	var err error
	var errs []error
	add := func(e error) { errs = append(errs, e) }
	r.m.dispatched, err = meter.Int64Counter("outbox.events.dispatched",
		metric.WithDescription("Events dispatched successfully and moved to outbox_published."))
	add(err)
	r.m.errors, err = meter.Int64Counter("outbox.dispatch.errors",
		metric.WithDescription("Failed dispatch attempts, by error kind (transient, permanent)."))
	add(err)
	r.m.failed, err = meter.Int64Counter("outbox.events.moved_to_failed",
		metric.WithDescription("Events moved to FAILED (permanent error, unknown type, attempts exhausted)."))
	add(err)
	r.m.unsettled, err = meter.Int64Counter("outbox.events.unsettled",
		metric.WithDescription("Dispatched events whose batch could not be recorded afterwards; they are dispatched again (duplicates)."))
	add(err)
	r.m.circuit, err = meter.Int64Counter("outbox.circuit.transitions",
		metric.WithDescription("State changes of a dependency's circuit, by dependency and new state (open, half_open, closed)."))
	add(err)
	circuitState, err := meter.Int64ObservableGauge("outbox.circuit.state",
		metric.WithDescription("State of each dependency's circuit: 0 closed, 1 half-open (a probe in flight), 2 open (its events are not dispatched)."))
	add(err)
	pending, err := meter.Int64ObservableGauge("outbox.events.pending",
		metric.WithDescription("Rows PENDING, in flight or not (capped scan), refreshed every stats interval."))
	add(err)
	failed, err := meter.Int64ObservableGauge("outbox.events.failed",
		metric.WithDescription("Rows in FAILED, waiting for an operator."))
	add(err)
	age, err := meter.Float64ObservableGauge("outbox.events.oldest_pending_age",
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest PENDING row; 0 when none."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("outbox: metrics: %w", err)
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, c := range r.circuitList {
			o.ObserveInt64(circuitState, int64(c.State()), metric.WithAttributes(attribute.String("dependency", c.Name())))
		}
		return nil
	}, circuitState)
	if err != nil {
		return fmt.Errorf("outbox: metrics: %w", err)
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := r.stats.Load()
		if s == nil {
			return nil
		}
		o.ObserveInt64(pending, s.Pending)
		o.ObserveInt64(failed, s.Failed)
		o.ObserveFloat64(age, s.OldestPendingAge.Seconds())
		return nil
	}, pending, failed, age)
	if err != nil {
		return fmt.Errorf("outbox: metrics: %w", err)
	}
	return nil
}

// count updates the metrics and logs of a committed batch; the success
// counter is added once per event type, not once per event.
func (r *Relay) count(ctx context.Context, rows []claimedRow, outs []outcome) {
	var published map[string]int64
	for i, o := range outs {
		ev := rows[i].ev
		typ := attribute.String("event_type", ev.Type)
		switch {
		case o.kind == outcomePublished:
			if published == nil {
				published = make(map[string]int64, 1)
			}
			published[ev.Type]++
		case o.kind == outcomeUnavailable:
			r.m.errors.Add(ctx, 1, metric.WithAttributes(typ, attribute.String("error.kind", "unavailable")))
			r.log.Debug("outbox dispatch found its dependency unavailable", "event_id", ev.ID, "event_type", ev.Type, "error", o.err)
		case o.kind == outcomeRetry && ev.Attempts < r.cfg.MaxAttempts:
			r.m.errors.Add(ctx, 1, metric.WithAttributes(typ, attribute.String("error.kind", "transient")))
			r.log.Warn("outbox dispatch failed; will retry", "event_id", ev.ID, "event_type", ev.Type, "attempt", ev.Attempts, "error", o.err)
		case o.kind == outcomeRetry || o.kind == outcomeFailed:
			kind := "permanent"
			if o.kind == outcomeRetry {
				kind = "transient" // attempts exhausted
			}
			r.m.errors.Add(ctx, 1, metric.WithAttributes(typ, attribute.String("error.kind", kind)))
			r.m.failed.Add(ctx, 1, metric.WithAttributes(typ))
			r.log.Error("outbox event moved to FAILED", "event_id", ev.ID, "event_type", ev.Type, "aggregate_id", ev.AggregateID, "attempt", ev.Attempts, "error", o.err)
		}
	}
	for typ, n := range published {
		r.m.dispatched.Add(ctx, n, metric.WithAttributes(attribute.String("event_type", typ)))
	}
}

// unsettled reports a batch whose outcome could not be recorded: the
// transaction is rolled back, every row is claimable again, and the events
// that were dispatched will be dispatched a second time (at-least-once;
// consumers deduplicate on event_id).
func (r *Relay) unsettled(ctx context.Context, rows []claimedRow, outs []outcome, err error) {
	n := 0
	for _, o := range outs {
		if o.kind == outcomePublished {
			n++
		}
	}
	if n == 0 {
		return
	}
	r.m.unsettled.Add(ctx, int64(n))
	r.log.Warn("outbox batch not recorded after dispatch; its events will be dispatched again", "dispatched", n, "rows", len(rows), "error", err)
}
