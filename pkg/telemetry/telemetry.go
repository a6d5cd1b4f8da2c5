// Package telemetry wires the three signals every lossless service emits:
//   - logs: log/slog on stdout, JSON by default, each line carrying the trace
//     and span ids when the context has a span; LOG_FORMAT=gcp writes Cloud
//     Logging's field names, so GKE's agent files severity and trace links;
//   - metrics: OpenTelemetry metrics exposed in Prometheus format on the
//     service's HTTP /metrics (always on);
//   - traces: OpenTelemetry spans exported over OTLP when an endpoint is
//     configured (off otherwise), with W3C trace context propagation.
//
// Traces follow the OpenTelemetry specification's environment variables: the
// OTLP exporter reads OTEL_EXPORTER_OTLP_* itself (endpoint, headers, TLS,
// timeout, compression), the SDK reads OTEL_TRACES_SAMPLER(_ARG) and
// OTEL_BSP_*, the resource reads OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES. No option overrides them; Setup only checks the
// values the SDK would otherwise ignore with a log line.
//
// Nothing here is global: Setup returns providers that the service passes to
// the components that need them.
//
// Lesson: a stall nobody can see is a loss waiting to happen; one wiring of
// logs, metrics and traces in every service makes each stall a number with
// an alert. It carries I7 (every gauge the pattern packages register, from
// the oldest pending outbox event to dead jobs, is exported on /metrics) and
// refuses the trace settings the SDK would ignore (the "misconfigured trace
// export" row of docs/failure-modes.md).
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
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// OTLP protocols (OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// Log formats (LOG_FORMAT).
const (
	// LogFormatJSON is slog's JSON: time, level, msg, trace_id, span_id.
	LogFormatJSON = "json"
	// LogFormatText is slog's key=value text, for a human at a terminal.
	LogFormatText = "text"
	// LogFormatGCP is JSON with Cloud Logging's special fields (severity,
	// message, logging.googleapis.com/trace, ...), which the GKE logging
	// agent lifts into the log entry: severity filters and the link from a
	// log line to its trace work.
	LogFormatGCP = "gcp"
)

// Config of a service's telemetry.
type Config struct {
	// ServiceName is the OpenTelemetry service.name unless OTEL_SERVICE_NAME
	// or OTEL_RESOURCE_ATTRIBUTES set one. Required.
	ServiceName string
	// ExportTraces turns the OTLP trace exporter on. The services set it
	// when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
	// is set, unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none
	// (their start-up code also vets the exporter's variables).
	// The exporter reads the endpoint and its other settings from those
	// variables itself, with the specification's meaning:
	// "http://collector:4317" is plain text, "https://..." is TLS (system
	// roots, or OTEL_EXPORTER_OTLP_CERTIFICATE). Default false: no traces.
	ExportTraces bool
	// OTLPProtocol is grpc or http/protobuf. Env
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL.
	// Default grpc (the SDK's default is http/protobuf, but the collectors
	// this system ships with listen on 4317).
	OTLPProtocol string
	// LogLevel is debug, info, warn or error. Env LOG_LEVEL. Default info.
	LogLevel string
	// LogFormat is json, text or gcp (see the LogFormat constants). Env
	// LOG_FORMAT. Default json.
	LogFormat string
	// ProjectID is the Google Cloud project of the traces that gcp log lines
	// link to ("projects/<id>/traces/<trace id>"). Required with LogFormat
	// gcp; the services set GOOGLE_CLOUD_PROJECT, their Pub/Sub project, or
	// the GCE/GKE metadata server's.
	ProjectID string
	// ResourceOptions describe the process beyond ServiceName (detectors,
	// attributes), merged over it in order (a later one wins). The services pass the detector of
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (service.instance.id,
	// deployment.environment, k8s.pod.name, ...), as the specification wants.
	// Default none.
	ResourceOptions []resource.Option
}

func (c *Config) setDefaults() {
	if c.OTLPProtocol == "" {
		c.OTLPProtocol = ProtocolGRPC
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.LogFormat == "" {
		c.LogFormat = LogFormatJSON
	}
}

// Validate reports invalid settings, naming the variable. Empty fields mean
// their defaults.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.ServiceName == "" {
		errs = append(errs, errors.New("telemetry: service name is empty"))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("LOG_LEVEL: %w", err))
	}
	switch c.LogFormat {
	case LogFormatJSON, LogFormatText, LogFormatGCP:
	default:
		errs = append(errs, fmt.Errorf("LOG_FORMAT: unknown format %q (json, text, gcp)", c.LogFormat))
	}
	switch c.OTLPProtocol {
	case ProtocolGRPC, ProtocolHTTPProtobuf:
	default:
		// The SDK would read an unknown protocol as http/protobuf.
		errs = append(errs, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL / OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: unsupported protocol %q (grpc, http/protobuf)", c.OTLPProtocol))
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

// Setup builds logs, metrics and traces for a service. out receives the log
// lines (os.Stdout in production). Every setting is checked before anything
// starts, so a bad value stops the process naming its variable.
// Setup reads no environment variable itself; the OTLP exporter and the
// trace SDK do (OTEL_EXPORTER_OTLP_*, OTEL_TRACES_SAMPLER).
func Setup(ctx context.Context, cfg Config, out io.Writer) (*Telemetry, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// service.name from the code first, so that the detectors (the
	// services': OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) are merged
	// over it.
	res, err := resource.New(ctx, append([]resource.Option{
		resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(cfg.ServiceName)),
	}, cfg.ResourceOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME: %w", err)
	}
	project := cfg.ProjectID
	if cfg.LogFormat == LogFormatGCP && project == "" {
		return nil, errors.New("telemetry: LOG_FORMAT=gcp needs the project of the traces (Config.ProjectID): set GOOGLE_CLOUD_PROJECT or run on GCE/GKE")
	}

	level, _ := parseLevel(cfg.LogLevel)
	t := &Telemetry{
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		Logger:     newLogger(out, level, cfg.LogFormat, project).With("service", cfg.ServiceName),
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

	if !cfg.ExportTraces {
		t.TracerProvider = noop.NewTracerProvider()
		return t, nil
	}
	// No options: each exporter reads OTEL_EXPORTER_OTLP_* (and the
	// TRACES_ variants, which win) itself; an option would override them.
	var traceExp sdktrace.SpanExporter
	if cfg.OTLPProtocol == ProtocolHTTPProtobuf {
		traceExp, err = otlptracehttp.New(ctx)
	} else {
		traceExp, err = otlptracegrpc.New(ctx)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("telemetry: OTLP exporter: %w", err), mp.Shutdown(ctx))
	}
	// The sampler comes from OTEL_TRACES_SAMPLER(_ARG), read by the SDK.
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
