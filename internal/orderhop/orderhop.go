// Package orderhop measures the latency of each hop of a work order's path,
// create → INVOICED, in the service where the hop ends: one histogram,
// order.hop.latency (Prometheus lossless_order_hop_latency_seconds), with a
// hop label. Each hop is computed from a timestamp that travels with the
// work (an event's occurred_at, a Pub/Sub publish time, an inbox entry's
// received_at, a job's created_at), never from an extra database read.
//
// The hops, in path order, each named by where it ends:
//
//	handoff           workorder     created (the hand-off event's occurred_at) → acceptance recorded (HANDED_OFF)
//	provider_start    provider-sim  job accepted → execution started
//	provider_execute  provider-sim  execution started → completed (the simulated work)
//	provider_publish  provider-sim  completion recorded → Pub/Sub accepted the completion
//	deliver           workorder     completion's Pub/Sub publish time → stored in the inbox
//	correlate         workorder     inbox received_at → order COMPLETED
//	billing_intake    billing       order COMPLETED (WorkOrderCompletionRecorded occurred_at) → invoice job enqueued
//	invoice_issue     billing       invoice job created → invoice issued
//	invoiced          workorder     invoice issued (InvoiceIssued issued_at) → order INVOICED
//
// A hop observed inside a transaction is observed just before its commit; a
// transaction that then fails observes it again on its retry, as the flow
// counters count.
package orderhop

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Hop names one hop of the path (the value of the hop label).
type Hop string

// The hops; see the package comment.
const (
	HandOff         Hop = "handoff"
	ProviderStart   Hop = "provider_start"
	ProviderExecute Hop = "provider_execute"
	ProviderPublish Hop = "provider_publish"
	Deliver         Hop = "deliver"
	Correlate       Hop = "correlate"
	BillingIntake   Hop = "billing_intake"
	InvoiceIssue    Hop = "invoice_issue"
	Invoiced        Hop = "invoiced"
)

// Path lists the hops in path order.
var Path = []Hop{HandOff, ProviderStart, ProviderExecute, ProviderPublish, Deliver, Correlate, BillingIntake, InvoiceIssue, Invoiced}

// InstrumentName is the histogram's OpenTelemetry name.
const InstrumentName = "order.hop.latency"

// Buckets span a loopback commit (sub-millisecond) to a retry after an
// outage (minutes).
var Buckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// Recorder observes hop latencies. The zero value and nil observe nothing.
type Recorder struct {
	h     metric.Float64Histogram
	attrs map[Hop]metric.RecordOption
}

// New returns a Recorder on meter; a nil meter observes nothing.
func New(meter metric.Meter) (*Recorder, error) {
	meter = telemetry.MeterOrNoop(meter)
	h, err := meter.Float64Histogram(InstrumentName, metric.WithUnit("s"),
		metric.WithDescription("Latency of one hop of a work order's path, by hop, observed where the hop ends."),
		metric.WithExplicitBucketBoundaries(Buckets...))
	if err != nil {
		return nil, err
	}
	// One attribute set per hop, built once: Observe allocates nothing.
	attrs := make(map[Hop]metric.RecordOption, len(Path))
	for _, hop := range Path {
		attrs[hop] = metric.WithAttributeSet(attribute.NewSet(attribute.String("hop", string(hop))))
	}
	return &Recorder{h: h, attrs: attrs}, nil
}

// Observe records hop as lasting from from to to. A zero from (the
// timestamp did not travel, e.g. a resumed job) records nothing; a negative
// span (clock skew between processes) records 0.
func (r *Recorder) Observe(ctx context.Context, hop Hop, from, to time.Time) {
	if r == nil || r.h == nil || from.IsZero() {
		return
	}
	opt, ok := r.attrs[hop]
	if !ok {
		return
	}
	r.h.Record(ctx, max(to.Sub(from).Seconds(), 0), opt)
}

// Time is ts as a time, zero when ts is absent (Observe then records
// nothing), where AsTime would give 1970.
func Time(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}
