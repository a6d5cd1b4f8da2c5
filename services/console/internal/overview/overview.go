// Package overview reads the services' Prometheus /metrics (text format)
// and turns them into the console's Overview figures: open orders per
// status, order rates, and the stall gauges of docs/observability.md. It
// keeps the last minute of counter samples to compute rates itself, so the
// console needs no Prometheus server.
package overview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metric family names read (deploy/compose/metrics.txt is the contract).
const (
	MetricOpenOrders       = "lossless_workorder_orders"
	MetricOrdersCreated    = "lossless_workorder_orders_created_total"
	MetricInvoicing        = "lossless_workorder_invoicing_messages_total"
	MetricOutboxOldest     = "lossless_outbox_events_oldest_pending_age_seconds"
	MetricInboxOldest      = "lossless_inbox_oldest_open_age_seconds"
	MetricInboxParked      = "lossless_inbox_parked_entries"
	MetricDeadLetterDepth  = "lossless_pubsub_dead_letter_depth"
	MetricLeasequeueJobs   = "lossless_leasequeue_jobs"
	rateWindow             = 10 * time.Second
	sampleRetention        = time.Minute
	maxMetricsBytes        = 8 << 20
	minimumRefreshInterval = 900 * time.Millisecond
)

// Target is one service's metrics endpoint.
type Target struct {
	Service string // "workorder"
	URL     string // "http://localhost:8080/metrics"
}

// Figures are one reading of the system.
type Figures struct {
	Time time.Time `json:"time"`
	// OpenOrders by status (CREATED, HANDED_OFF, COMPLETED): the workorder
	// service's capped gauge, refreshed every 15 s there.
	OpenOrders map[string]float64 `json:"open_orders"`
	// OrdersCreated and OrdersInvoiced are the counters since the workorder
	// process started; the rates are per second over the last 10 s of
	// readings (0 until there are two).
	OrdersCreated     float64 `json:"orders_created"`
	OrdersInvoiced    float64 `json:"orders_invoiced"`
	CreatedPerSecond  float64 `json:"created_per_second"`
	InvoicedPerSecond float64 `json:"invoiced_per_second"`
	// Stall gauges: the largest over the services that export them.
	OldestPendingOutboxSeconds float64 `json:"oldest_pending_outbox_seconds"`
	OldestOpenInboxSeconds     float64 `json:"oldest_open_inbox_seconds"`
	DeadLetterDepth            float64 `json:"dead_letter_depth"`
	DeadJobs                   float64 `json:"dead_jobs"`
	// ParkedInbox by park reason.
	ParkedInbox map[string]float64 `json:"parked_inbox"`
	// Unreachable names each service whose /metrics could not be read, with
	// the reason; its figures are missing from the sums.
	Unreachable map[string]string `json:"unreachable,omitempty"`
}

// Reader scrapes the targets on demand. Readings closer together than
// 900 ms are served from the last one, so many open browser tabs cost the
// services one scrape per second.
type Reader struct {
	targets []Target
	client  *http.Client
	now     func() time.Time

	mu      sync.Mutex
	last    *Figures
	samples []sample // counter readings, oldest first
}

type sample struct {
	at                time.Time
	created, invoiced float64
}

// Option customises a Reader.
type Option func(*Reader)

// WithClock replaces time.Now (tests).
func WithClock(now func() time.Time) Option { return func(r *Reader) { r.now = now } }

// NewReader reads targets with client (its Timeout bounds each scrape).
func NewReader(targets []Target, client *http.Client, opts ...Option) (*Reader, error) {
	if len(targets) == 0 || client == nil {
		return nil, errors.New("overview: NewReader needs targets and an HTTP client")
	}
	r := &Reader{targets: targets, client: client, now: time.Now}
	for _, o := range opts {
		o(r)
	}
	return r, nil
}

// Read returns the current figures.
func (r *Reader) Read(ctx context.Context) (Figures, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if r.last != nil && now.Sub(r.last.Time) < minimumRefreshInterval {
		return *r.last, nil
	}
	f := Figures{Time: now, OpenOrders: map[string]float64{}, ParkedInbox: map[string]float64{}}
	type result struct {
		fams map[string]*dto.MetricFamily
		err  error
	}
	results := make([]result, len(r.targets))
	var wg sync.WaitGroup
	for i, t := range r.targets {
		wg.Go(func() {
			results[i].fams, results[i].err = r.scrape(ctx, t.URL)
		})
	}
	wg.Wait()
	for i, res := range results {
		if res.err != nil {
			if f.Unreachable == nil {
				f.Unreachable = map[string]string{}
			}
			f.Unreachable[r.targets[i].Service] = res.err.Error()
			continue
		}
		add(&f, res.fams)
	}
	// The order counters are workorder's: without its reading there is no
	// sample (a missing reading is not a drop to zero).
	if _, down := f.Unreachable["workorder"]; !down {
		s := sample{at: now, created: f.OrdersCreated, invoiced: f.OrdersInvoiced}
		if n := len(r.samples); n > 0 && (s.created < r.samples[n-1].created || s.invoiced < r.samples[n-1].invoiced) {
			r.samples = r.samples[:0] // the process restarted: its counters start over
		}
		r.samples = append(r.samples, s)
	}
	for len(r.samples) > 0 && now.Sub(r.samples[0].at) > sampleRetention {
		r.samples = r.samples[1:]
	}
	f.CreatedPerSecond, f.InvoicedPerSecond = r.rates(now)
	r.last = &f
	return f, nil
}

// rates compares the newest sample with the oldest one inside the window. A
// counter that went down (the process restarted) yields no rate.
func (r *Reader) rates(now time.Time) (created, invoiced float64) {
	if len(r.samples) < 2 {
		return 0, 0
	}
	newest := r.samples[len(r.samples)-1]
	i := sort.Search(len(r.samples), func(i int) bool { return now.Sub(r.samples[i].at) <= rateWindow })
	oldest := r.samples[min(i, len(r.samples)-2)]
	dt := newest.at.Sub(oldest.at).Seconds()
	if dt <= 0 || newest.created < oldest.created || newest.invoiced < oldest.invoiced {
		return 0, 0
	}
	return (newest.created - oldest.created) / dt, (newest.invoiced - oldest.invoiced) / dt
}

func (r *Reader) scrape(ctx context.Context, u string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics unreachable: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: HTTP %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return nil, fmt.Errorf("metrics unreadable: %w", err)
	}
	return fams, nil
}

// add folds one service's families into f.
func add(f *Figures, fams map[string]*dto.MetricFamily) {
	each := func(name string, fn func(labels map[string]string, v float64)) {
		fam := fams[name]
		if fam == nil {
			return
		}
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			var v float64
			switch {
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Untyped != nil:
				v = m.GetUntyped().GetValue()
			default:
				continue
			}
			fn(labels, v)
		}
	}
	each(MetricOpenOrders, func(l map[string]string, v float64) { f.OpenOrders[l["status"]] += v })
	each(MetricOrdersCreated, func(_ map[string]string, v float64) { f.OrdersCreated += v })
	each(MetricInvoicing, func(l map[string]string, v float64) {
		if l["outcome"] == "invoiced" {
			f.OrdersInvoiced += v
		}
	})
	each(MetricOutboxOldest, func(_ map[string]string, v float64) {
		f.OldestPendingOutboxSeconds = max(f.OldestPendingOutboxSeconds, v)
	})
	each(MetricInboxOldest, func(_ map[string]string, v float64) { f.OldestOpenInboxSeconds = max(f.OldestOpenInboxSeconds, v) })
	each(MetricInboxParked, func(l map[string]string, v float64) { f.ParkedInbox[l["reason"]] += v })
	each(MetricDeadLetterDepth, func(_ map[string]string, v float64) { f.DeadLetterDepth += v })
	each(MetricLeasequeueJobs, func(l map[string]string, v float64) {
		if l["state"] == "dead" {
			f.DeadJobs += v
		}
	})
}
