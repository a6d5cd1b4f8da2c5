package server

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Process is an assembled service, what its app.New returns: Run serves
// until ctx ends.
type Process interface {
	Run(ctx context.Context) error
}

// ExitError is an outcome that is not a failure but must show in the exit
// status, such as "discrepancies found" (status 3) for a cron job to alert
// on. Main exits with Code without logging it.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }

func (e *ExitError) Unwrap() error { return e.Err }

// Main runs a service's command line, run, under SignalContext and returns
// the process's exit status: 0 when run returns nil; the Code of an
// *ExitError in the error's chain; else 1, after logging "<name> failed"
// with the error as one JSON line on stderr, so that a process which fails
// before its telemetry exists (a bad configuration) still logs the way the
// service does. A service's main is os.Exit(server.Main(...)).
func Main(name string, stderr io.Writer, run func(ctx context.Context) error) int {
	ctx, stop := SignalContext(context.Background())
	defer stop()
	err := run(ctx)
	if err == nil {
		return 0
	}
	if exit, ok := errors.AsType[*ExitError](err); ok {
		return exit.Code
	}
	slog.New(slog.NewJSONHandler(stderr, nil)).Error(name+" failed", "error", err.Error())
	return 1
}

// NewProcess assembles a service from its telemetry: the logger, the
// providers and the options it must pass to New (the admin /metrics handler).
type NewProcess func(ctx context.Context, logger *slog.Logger, tel telemetry.Providers, opts ...Option) (Process, error)

// Serve is the serve command of a service whose configuration is loaded
// and validated: it sets up telemetry from tcfg (log lines to stdout),
// assembles the service with newProcess, passing it the telemetry's logger
// and providers and WithAdminHTTPHandler("GET /metrics", ...) (metrics are
// served on the admin listener only), runs it until ctx
// ends, and then flushes the telemetry, whose error joins Run's.
func Serve(ctx context.Context, tcfg telemetry.Config, stdout io.Writer, newProcess NewProcess) (err error) {
	tel, err := telemetry.Setup(ctx, tcfg, stdout)
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, tel.Shutdown(context.WithoutCancel(ctx)))
	}()
	p, err := newProcess(ctx, tel.Logger, tel.Providers(),
		WithAdminHTTPHandler("GET /metrics", tel.MetricsHandler))
	if err != nil {
		return err
	}
	return p.Run(ctx)
}
