package leasequeue

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// metrics of one queue. Counters are per process; the gauges show the last
// Queue.RunStats refresh (the table's totals, the same on every replica).
type metrics struct {
	attrs, attrsFresh, attrsRescued metric.MeasurementOption

	enqueued, claimed, completed, retried, dead, released metric.Int64Counter
	// fenced counts completions and failures rejected by the fencing token:
	// a worker that lost its lease tried to write (F13). Expected rarely
	// (long GC pauses, partitions); a steady rate means leases are too short.
	fenced metric.Int64Counter
	// leaseLost counts heartbeats that found a job taken over.
	leaseLost metric.Int64Counter
}

func newMetrics(meter metric.Meter, q *Queue) (*metrics, error) {
	queue := attribute.String("queue", q.cfg.Name)
	m := &metrics{
		attrs:        metric.WithAttributes(queue),
		attrsFresh:   metric.WithAttributes(queue, attribute.String("source", "available")),
		attrsRescued: metric.WithAttributes(queue, attribute.String("source", "expired_lease")),
	}
	counters := []struct {
		dst  *metric.Int64Counter
		name string
		desc string
	}{
		{&m.enqueued, "leasequeue.jobs.enqueued", "Jobs inserted (duplicates by unique key excluded)."},
		{&m.claimed, "leasequeue.jobs.claimed", "Claims, by source: available jobs or expired leases (rescues)."},
		{&m.completed, "leasequeue.jobs.completed", "Jobs completed with their effects committed."},
		{&m.retried, "leasequeue.jobs.retried", "Failed attempts scheduled for a retry after a backoff."},
		{&m.dead, "leasequeue.jobs.dead", "Jobs parked: permanent error, attempts exhausted, or lease expired on the last attempt. Alert on any."},
		{&m.released, "leasequeue.jobs.released", "Jobs given back on graceful shutdown."},
		{&m.fenced, "leasequeue.lease.fenced", "Writes rejected by the fencing token: a worker whose lease was lost tried to complete or fail a job; nothing was committed."},
		{&m.leaseLost, "leasequeue.lease.lost", "Heartbeats that found a job's lease taken over by another claim."},
	}
	for _, c := range counters {
		var err error
		if *c.dst, err = meter.Int64Counter(c.name, metric.WithDescription(c.desc)); err != nil {
			return nil, err
		}
	}
	// Alerted series exist from the start at 0 (an alert on increase()
	// cannot see a series' first sample).
	for _, c := range []struct {
		c metric.Int64Counter
		a metric.MeasurementOption
	}{{m.fenced, m.attrs}, {m.dead, m.attrs}, {m.claimed, m.attrsRescued}, {m.claimed, m.attrsFresh}} {
		c.c.Add(context.Background(), 0, c.a)
	}
	jobsG, err := meter.Int64ObservableGauge("leasequeue.jobs",
		metric.WithDescription("Jobs by state (available, running, dead; capped counts), refreshed every StatsInterval. dead = parked, waiting for an operator: alert on any."))
	if err != nil {
		return nil, err
	}
	expiredG, err := meter.Int64ObservableGauge("leasequeue.leases.expired",
		metric.WithDescription("Running jobs whose lease has expired and not yet been rescued (alert when > 0 for longer than the rescue interval)."))
	if err != nil {
		return nil, err
	}
	ageG, err := meter.Float64ObservableGauge("leasequeue.jobs.oldest_available_age",
		metric.WithUnit("s"), metric.WithDescription("Age of the oldest due, unclaimed job."))
	if err != nil {
		return nil, err
	}
	queue = attribute.String("queue", q.cfg.Name)
	byState := map[State]metric.MeasurementOption{}
	for _, st := range []State{StateAvailable, StateRunning, StateDead} {
		byState[st] = metric.WithAttributes(queue, attribute.String("state", string(st)))
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := q.stats.Load()
		if s == nil {
			return nil
		}
		o.ObserveInt64(jobsG, s.Available, byState[StateAvailable])
		o.ObserveInt64(jobsG, s.Running, byState[StateRunning])
		o.ObserveInt64(jobsG, s.Dead, byState[StateDead])
		o.ObserveInt64(expiredG, s.ExpiredLeases, m.attrs)
		o.ObserveFloat64(ageG, s.OldestAvailableAge.Seconds(), m.attrs)
		return nil
	}, jobsG, expiredG, ageG)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (q *Queue) countFailures(ctx context.Context, res []failResult) {
	for _, r := range res {
		switch {
		case r.err != nil:
			q.m.fenced.Add(ctx, 1, q.m.attrs)
		case r.dead:
			q.m.dead.Add(ctx, 1, q.m.attrs)
		default:
			q.m.retried.Add(ctx, 1, q.m.attrs)
		}
	}
}
