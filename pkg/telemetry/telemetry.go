// Package telemetry wires the three signals every lossless service emits:
//   - logs: log/slog JSON on stdout, each line carrying trace_id and span_id
//     when the context has a span;
//   - metrics: OpenTelemetry metrics exposed in Prometheus format on the
//     service's HTTP /metrics (always on);
//   - traces: OpenTelemetry spans exported over OTLP/gRPC when an endpoint is
//     configured (off otherwise), with W3C trace context propagation.
//
// Nothing here is global: Setup returns providers that the service passes to
// the components that need them.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/lossless-dev/lossless/pkg/envconfig"
)

// Config of a service's telemetry.
type Config struct {
	// ServiceName is the OpenTelemetry service.name. Required.
	ServiceName string
	// OTLPEndpoint is the OTLP/gRPC collector, as the OpenTelemetry
	// specification writes it ("http://otel-collector:4317"; a bare
	// "host:port" is accepted too). Plain-text gRPC either way: the collector
	// is a sidecar or on the local network. Env OTEL_EXPORTER_OTLP_ENDPOINT.
	// Default "": traces are not exported.
	OTLPEndpoint string
	// LogLevel is debug, info, warn or error. Env LOG_LEVEL. Default info.
	LogLevel string
}

// ConfigFromEnv reads the telemetry settings of service from the environment.
func ConfigFromEnv(r *envconfig.Reader, service string) Config {
	return Config{
		ServiceName:  service,
		OTLPEndpoint: r.String("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
		LogLevel:     r.String("LOG_LEVEL", "info"),
	}
}

// Validate reports invalid settings, naming the variable.
func (c Config) Validate() error {
	var errs []error
	if c.ServiceName == "" {
		errs = append(errs, errors.New("telemetry: service name is empty"))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, envconfig.Check("LOG_LEVEL", err))
	}
	return errors.Join(errs...)
}

// MetricNamespace prefixes every metric a service exports
// ("lossless_..."), so the system's series are easy to find and cannot
// collide with those of other software on the same Prometheus.
const MetricNamespace = "lossless"

// Telemetry holds a service's providers.
type Telemetry struct {
	Logger         *slog.Logger
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
	// MetricsHandler serves the Prometheus exposition for /metrics.
	MetricsHandler http.Handler
	shutdown       []func(context.Context) error
}

// Setup builds logs, metrics and traces for a service. out receives the JSON
// log lines (os.Stdout in production).
func Setup(ctx context.Context, cfg Config, out io.Writer) (*Telemetry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	level, _ := parseLevel(cfg.LogLevel)
	t := &Telemetry{
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
	t.Logger = NewLogger(out, level).With("service", cfg.ServiceName)

	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(cfg.ServiceName)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}

	// A registry of our own, not the global default one.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Namespace "lossless": instrument "inbox.oldest_open_age" (unit s) is
	// exported as lossless_inbox_oldest_open_age_seconds. deploy/compose/
	// metrics.txt lists the names the alerts and dashboards rely on.
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithNamespace(MetricNamespace))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res))
	t.MeterProvider = mp
	t.MetricsHandler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	t.shutdown = append(t.shutdown, mp.Shutdown)

	if cfg.OTLPEndpoint == "" {
		t.TracerProvider = noop.NewTracerProvider()
		return t, nil
	}
	traceExp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(strings.TrimPrefix(cfg.OTLPEndpoint, "http://")), otlptracegrpc.WithInsecure())
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(traceExp), sdktrace.WithResource(res), sdktrace.WithRawSpanLimits(SpanLimits()))
	t.TracerProvider = tp
	t.shutdown = append(t.shutdown, tp.Shutdown)
	return t, nil
}

// Providers returns the providers to pass to a service's assembly.
func (t *Telemetry) Providers() Providers {
	return Providers{MeterProvider: t.MeterProvider, TracerProvider: t.TracerProvider, Propagator: t.Propagator}
}

// Shutdown flushes and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	return errors.Join(errs...)
}

// SpanLimits are the SDK's defaults except for links: a consumer span of a
// batch links to every message's producer (up to 1000 per Pub/Sub Pull), and
// the default of 128 would silently cut the chain of the others.
func SpanLimits() sdktrace.SpanLimits {
	l := sdktrace.NewSpanLimits()
	l.LinkCountLimit = 1000
	return l
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("unknown log level %q (debug, info, warn, error)", s)
	}
	return l, nil
}
