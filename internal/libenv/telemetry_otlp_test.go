package libenv_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// These tests set process environment variables (the exporter reads them
// from there, not from a Reader), so none of them runs in parallel.

// received is what a collector got: span names, resource attributes, and
// the request headers of the exports.
type received struct {
	mu       sync.Mutex
	spans    []string
	resource map[string]string
	headers  map[string][]string
}

func (r *received) record(req *collectortrace.ExportTraceServiceRequest, headers map[string][]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.resource == nil {
		r.resource, r.headers = map[string]string{}, map[string][]string{}
	}
	for k, v := range headers {
		r.headers[strings.ToLower(k)] = v
	}
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			r.resource[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, s.GetName())
			}
		}
	}
}

func (r *received) snapshot() (spans []string, resource map[string]string, headers map[string][]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.spans, r.resource, r.headers
}

// grpcCollector is an OTLP/gRPC trace receiver on a loopback port.
type grpcCollector struct {
	collectortrace.UnimplementedTraceServiceServer
	received
}

func (c *grpcCollector) Export(ctx context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c.record(req, md)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// startGRPCCollector serves OTLP/gRPC, over TLS when cert is not nil, and
// returns its host:port.
func startGRPCCollector(t *testing.T, cert *tls.Certificate) (string, *grpcCollector) {
	t.Helper()
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if cert != nil {
		opts = append(opts, grpc.Creds(credentials.NewServerTLSFromCert(cert)))
	}
	c := &grpcCollector{}
	srv := grpc.NewServer(opts...)
	collectortrace.RegisterTraceServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), c
}

// selfSigned returns a certificate for 127.0.0.1 and the path of its PEM,
// as an operator would hand a private CA to OTEL_EXPORTER_OTLP_CERTIFICATE.
func selfSigned(t *testing.T) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test collector"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, path
}

// setupFromEnv does what a service's main does: read the config from the
// environment, then Setup.
func setupFromEnv(t *testing.T) (*telemetry.Telemetry, error) {
	t.Helper()
	r := envconfig.New()
	cfg := libenv.Telemetry(r, "svc")
	if err := r.Err(); err != nil {
		return nil, err
	}
	return telemetry.Setup(context.Background(), cfg, io.Discard)
}

// emitOneSpan ends one span and shuts telemetry down, which flushes the
// batch: once Shutdown returns, whatever was exported has been received.
func emitOneSpan(t *testing.T, tel *telemetry.Telemetry, name string) {
	t.Helper()
	_, span := tel.TracerProvider.Tracer("test").Start(context.Background(), name)
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSpansReachATLSCollectorWithTheHeadersAndResourceFromTheEnvironment(t *testing.T) {
	cert, caFile := selfSigned(t)
	addr, col := startGRPCCollector(t, &cert)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://"+addr)
	t.Setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", caFile)
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20abc123,x-team=billing")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.instance.id=billing-7d9f")
	tel, err := setupFromEnv(t)
	if err != nil {
		t.Fatal(err)
	}
	emitOneSpan(t, tel, "issue invoice")

	spans, res, headers := col.snapshot()
	if len(spans) != 1 || spans[0] != "issue invoice" {
		t.Fatalf("collector received spans %v; want the one span, over TLS", spans)
	}
	if got := headers["authorization"]; len(got) != 1 || got[0] != "Bearer abc123" {
		t.Errorf("authorization metadata %q; want the URL-decoded header value", got)
	}
	if got := headers["x-team"]; len(got) != 1 || got[0] != "billing" {
		t.Errorf("x-team metadata %q", got)
	}
	for k, want := range map[string]string{"service.name": "svc", "deployment.environment": "prod", "service.instance.id": "billing-7d9f"} {
		if res[k] != want {
			t.Errorf("resource %s = %q, want %q (resource %v)", k, res[k], want, res)
		}
	}
}

// What compose and `make run` set: an http:// endpoint means plain text.
// OTEL_SERVICE_NAME wins over the name in the code.
func TestHTTPSchemeEndpointIsPlainTextGRPC(t *testing.T) {
	addr, col := startGRPCCollector(t, nil)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr)
	t.Setenv("OTEL_SERVICE_NAME", "billing-eu")
	tel, err := setupFromEnv(t)
	if err != nil {
		t.Fatal(err)
	}
	emitOneSpan(t, tel, "op")
	spans, res, _ := col.snapshot()
	if len(spans) != 1 || res["service.name"] != "billing-eu" {
		t.Fatalf("spans %v, resource %v; want one span from service billing-eu", spans, res)
	}
}

// The per-signal endpoint wins over the generic one, as the specification
// says; the generic one here would receive nothing.
func TestTracesEndpointWinsOverTheGenericOne(t *testing.T) {
	addr, col := startGRPCCollector(t, nil)
	other, otherCol := startGRPCCollector(t, nil)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+other)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://"+addr)
	tel, err := setupFromEnv(t)
	if err != nil {
		t.Fatal(err)
	}
	emitOneSpan(t, tel, "op")
	if spans, _, _ := col.snapshot(); len(spans) != 1 {
		t.Fatalf("traces endpoint received %v; want the span", spans)
	}
	if spans, _, _ := otherCol.snapshot(); len(spans) != 0 {
		t.Fatalf("generic endpoint received %v; want nothing", spans)
	}
}

func TestHTTPProtobufProtocol(t *testing.T) {
	var rec received
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		req := &collectortrace.ExportTraceServiceRequest{}
		if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		rec.record(req, r.Header)
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k")
	tel, err := setupFromEnv(t)
	if err != nil {
		t.Fatal(err)
	}
	emitOneSpan(t, tel, "op")
	spans, _, headers := rec.snapshot()
	if len(spans) != 1 || len(headers["x-api-key"]) != 1 || headers["x-api-key"][0] != "k" {
		t.Fatalf("OTLP/HTTP received spans %v, headers %v; want one span with x-api-key", spans, headers)
	}
}

// Settings that turn export off leave a collector that would answer with
// nothing: no endpoint (the exporter's settings alone are not enough), the
// SDK disabled, or a sampler that drops every trace (read by the SDK from
// the environment, not overridden).
func TestNoExportWithoutEndpointOrWhenDisabledOrSampledOut(t *testing.T) {
	t.Run("no endpoint", func(t *testing.T) {
		_, caFile := selfSigned(t)
		t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k")
		t.Setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", caFile)
		tel, err := setupFromEnv(t)
		if err != nil {
			t.Fatal(err)
		}
		_, span := tel.TracerProvider.Tracer("test").Start(context.Background(), "op")
		span.End()
		if span.SpanContext().IsValid() {
			t.Fatal("spans are recorded without an endpoint; want the no-op provider")
		}
	})
	for name, env := range map[string][2]string{
		"sdk disabled":       {"OTEL_SDK_DISABLED", "true"},
		"exporter none":      {"OTEL_TRACES_EXPORTER", "none"},
		"sampler always_off": {"OTEL_TRACES_SAMPLER", "always_off"},
	} {
		t.Run(name, func(t *testing.T) {
			addr, col := startGRPCCollector(t, nil)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr)
			t.Setenv(env[0], env[1])
			tel, err := setupFromEnv(t)
			if err != nil {
				t.Fatal(err)
			}
			emitOneSpan(t, tel, "op")
			if spans, _, _ := col.snapshot(); len(spans) != 0 {
				t.Fatalf("%s=%s: collector received %v; want nothing", env[0], env[1], spans)
			}
		})
	}
}

// A value the SDK would ignore with a log line (or misread) stops Setup,
// naming the variable.
func TestInvalidOTelSettingsFailNamingTheVariable(t *testing.T) {
	certFile := filepath.Join(t.TempDir(), "not-a-cert.pem")
	if err := os.WriteFile(certFile, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, value string }{
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "otel-collector:4317"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "127.0.0.1:4317"},
		{"OTEL_EXPORTER_OTLP_HEADERS", "api-key"},
		{"OTEL_EXPORTER_OTLP_HEADERS", "bad key=v"},
		{"OTEL_EXPORTER_OTLP_CERTIFICATE", filepath.Join(t.TempDir(), "missing.pem")},
		{"OTEL_EXPORTER_OTLP_CERTIFICATE", certFile},
		{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", certFile},
		{"OTEL_EXPORTER_OTLP_INSECURE", "yes"},
		{"OTEL_EXPORTER_OTLP_TIMEOUT", "10s"},
		{"OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"},
		{"OTEL_TRACES_SAMPLER", "jaeger_remote"},
		{"OTEL_TRACES_SAMPLER_ARG", "2"},
		{"OTEL_TRACES_EXPORTER", "zipkin"},
		{"OTEL_SDK_DISABLED", "maybe"},
		{"OTEL_RESOURCE_ATTRIBUTES", "deployment.environment"},
		{"LOG_FORMAT", "xml"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			addr, _ := startGRPCCollector(t, nil)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr)
			if tc.name == "OTEL_TRACES_SAMPLER_ARG" {
				t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
			}
			t.Setenv(tc.name, tc.value)
			tel, err := setupFromEnv(t)
			if err == nil {
				_ = tel.Shutdown(context.Background())
				t.Fatalf("%s=%q accepted", tc.name, tc.value)
			}
			if !strings.Contains(err.Error(), tc.name) {
				t.Fatalf("error %q does not name %s", err, tc.name)
			}
		})
	}
}
