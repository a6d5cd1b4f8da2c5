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
	// OTLPEndpoint is the OTLP/gRPC collector address ("otel-collector:4317").
	// Env OTEL_EXPORTER_OTLP_ENDPOINT. Default "": traces are not exported.
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
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
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
	traceExp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(cfg.OTLPEndpoint), otlptracegrpc.WithInsecure())
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(traceExp), sdktrace.WithResource(res))
	t.TracerProvider = tp
	t.shutdown = append(t.shutdown, tp.Shutdown)
	return t, nil
}

// Shutdown flushes and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	return errors.Join(errs...)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("unknown log level %q (debug, info, warn, error)", s)
	}
	return l, nil
}
