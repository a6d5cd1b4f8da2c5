package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Main's exit status: 0 on success, an ExitError's code without a log line,
// 1 after one JSON line naming the service and the error.
func TestMain_ExitStatusAndTheFailureLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		err     error
		code    int
		logLine string
	}{
		{"success", nil, 0, ""},
		{"exit error", fmt.Errorf("reconcile: %w", &server.ExitError{Code: 3, Err: errors.New("discrepancies found")}), 3, ""},
		{"failure", errors.New("DATABASE_URL: required but not set"), 1,
			`"level":"ERROR","msg":"shipping failed","error":"DATABASE_URL: required but not set"`},
	} {
		var stderr bytes.Buffer
		ran := false
		code := server.Main("shipping", &stderr, func(ctx context.Context) error {
			ran = ctx.Err() == nil
			return tc.err
		})
		if !ran || code != tc.code {
			t.Errorf("%s: ran %v with a live context, exit status %d; want true, %d", tc.name, ran, code, tc.code)
		}
		if tc.logLine == "" && stderr.Len() != 0 {
			t.Errorf("%s: logged %q, want nothing", tc.name, stderr.String())
		}
		if tc.logLine != "" && (!strings.Contains(stderr.String(), tc.logLine) || strings.Count(stderr.String(), "\n") != 1) {
			t.Errorf("%s: logged %q, want one JSON line with %s", tc.name, stderr.String(), tc.logLine)
		}
	}
}

// Serve hands the process the telemetry's logger (lines on stdout, with the
// service name) and the /metrics handler, on the admin listener only, and
// runs it until ctx ends.
func TestServe_AssemblesWithTelemetryAndServesMetrics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout logBuffer
	metrics, public := make(chan int, 1), make(chan int, 1)
	err := server.Serve(ctx, telemetry.Config{ServiceName: "shipping"}, &stdout,
		func(ctx context.Context, logger *slog.Logger, _ telemetry.Providers, opts ...server.Option) (server.Process, error) {
			srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
				AdminHTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second}, logger, opts...)
			if err != nil {
				return nil, err
			}
			go func() {
				defer cancel()
				metrics <- statusOf(ctx, "http://"+srv.AdminHTTPAddr()+"/metrics")
				public <- statusOf(ctx, "http://"+srv.HTTPAddr()+"/metrics")
			}()
			return srv, nil
		})
	if err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if code := <-metrics; code != http.StatusOK {
		t.Fatalf("GET /metrics on the admin listener = %d, want 200", code)
	}
	if code := <-public; code != http.StatusNotFound {
		t.Fatalf("GET /metrics on the public listener = %d, want 404", code)
	}
	if !strings.Contains(stdout.String(), `"service":"shipping"`) {
		t.Fatalf("the process's log lines on stdout lack the service name:\n%s", stdout.String())
	}
}

// Serve returns the assembly's error, and Run's.
func TestServe_ReturnsTheAssemblyAndRunErrors(t *testing.T) {
	t.Parallel()
	for _, want := range []string{"assemble", "run"} {
		err := server.Serve(context.Background(), telemetry.Config{ServiceName: "shipping"}, io.Discard,
			func(context.Context, *slog.Logger, telemetry.Providers, ...server.Option) (server.Process, error) {
				if want == "assemble" {
					return nil, errors.New("assemble failed")
				}
				return runFunc(func(context.Context) error { return errors.New("run failed") }), nil
			})
		if err == nil || !strings.Contains(err.Error(), want+" failed") {
			t.Errorf("Serve: %v, want the %s error", err, want)
		}
	}
	err := server.Serve(context.Background(), telemetry.Config{}, io.Discard,
		func(context.Context, *slog.Logger, telemetry.Providers, ...server.Option) (server.Process, error) {
			t.Error("assembled with an invalid telemetry configuration")
			return nil, nil
		})
	if err == nil || !strings.Contains(err.Error(), "service name") {
		t.Errorf("Serve with no service name: %v, want the telemetry configuration's error", err)
	}
}

type runFunc func(context.Context) error

func (f runFunc) Run(ctx context.Context) error { return f(ctx) }

// statusOf is url's status code, 0 when it does not answer. server.New
// has bound the listener, so the request waits for Run to serve it.
func statusOf(ctx context.Context, url string) int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
