package telemetry

import (
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Providers are the metric and trace dependencies a service assembles its
// components with. They are passed explicitly (never installed as the
// OpenTelemetry globals), so a test can run three services in one process,
// each with its own providers. A nil field means "off" (see WithDefaults).
type Providers struct {
	// MeterProvider creates the components' instruments. nil: no metrics.
	MeterProvider metric.MeterProvider
	// TracerProvider creates spans. nil: no traces.
	TracerProvider trace.TracerProvider
	// Propagator reads and writes trace context on gRPC and HTTP hops.
	// nil: W3C trace context.
	Propagator propagation.TextMapPropagator
}

// WithDefaults replaces nil fields by no-op providers and the W3C propagator.
func (p Providers) WithDefaults() Providers {
	if p.MeterProvider == nil {
		p.MeterProvider = metricnoop.NewMeterProvider()
	}
	if p.TracerProvider == nil {
		p.TracerProvider = tracenoop.NewTracerProvider()
	}
	if p.Propagator == nil {
		p.Propagator = propagation.TraceContext{}
	}
	return p
}

// MeterOrNoop returns meter, or a no-op meter when it is nil: the fallback
// of every constructor whose meter is optional.
func MeterOrNoop(meter metric.Meter) metric.Meter {
	if meter == nil {
		return metricnoop.NewMeterProvider().Meter("")
	}
	return meter
}
