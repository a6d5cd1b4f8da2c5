// Command pubsub-emulator serves the Go client's Pub/Sub fake (pstest) on a
// real gRPC port, so services reach it exactly as they reach the Cloud SDK
// emulator or GCP: through PUBSUB_EMULATOR_HOST. It is the Pub/Sub of `make
// run`, tests and CI on machines without Docker.
//
// What pstest does differently from real Pub/Sub is in
// docs/adr/0004-pubsub-emulator.md. Two limits matter for long runs: every
// message ever published stays in memory (pstest drops them only on
// ClearMessages, which would also forget unacked ones, so this binary never
// calls it: restart it to reclaim memory), and a message that stays
// undelivered for 10 minutes is silently dropped.
//
// Usage:
//
//	pubsub-emulator [-listen 127.0.0.1:8085] [-provision] [-project lossless-local]
//
// Env: PUBSUB_EMULATOR_LISTEN, PUBSUB_EMULATOR_PROVISION, PUBSUB_PROJECT_ID.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/lossless-dev/lossless/internal/devtools/declared"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// config of the emulator process.
type config struct {
	// Listen is the gRPC address. Env PUBSUB_EMULATOR_LISTEN, default
	// 127.0.0.1:8085 (the Cloud SDK emulator's port, so PUBSUB_EMULATOR_HOST
	// values work with either). Use 0.0.0.0:8085 inside a container.
	Listen string
	// Provision creates the whole system's topology at start, as
	// services/*/service.json of the checkout holding the working directory
	// declare it (internal/devtools/declared). Env PUBSUB_EMULATOR_PROVISION,
	// default false (services run `provision`).
	Provision bool
	// ProjectID is the project provisioned into. Env PUBSUB_PROJECT_ID,
	// default "lossless-local".
	ProjectID string
}

func (c config) validate() error {
	if c.Listen == "" {
		return errors.New("PUBSUB_EMULATOR_LISTEN: must not be empty")
	}
	return pubsub.ClientConfig{ProjectID: c.ProjectID}.Validate()
}

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(os.Args[1:], logger); err != nil {
		logger.Error("pubsub-emulator failed", "error", err)
		os.Exit(1)
	}
}

func run(args []string, logger *slog.Logger) error {
	env := envconfig.New()
	cfg := config{
		Listen:    env.String("PUBSUB_EMULATOR_LISTEN", "127.0.0.1:8085"),
		Provision: env.Bool("PUBSUB_EMULATOR_PROVISION", false),
		ProjectID: env.String(libenv.EnvPubSubProjectID, pubsub.DefaultProjectID),
	}
	if err := env.Err(); err != nil {
		return err
	}
	fs := flag.NewFlagSet("pubsub-emulator", flag.ContinueOnError)
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC listen address (env PUBSUB_EMULATOR_LISTEN)")
	fs.BoolVar(&cfg.Provision, "provision", cfg.Provision, "create the system topology at start (env PUBSUB_EMULATOR_PROVISION)")
	fs.StringVar(&cfg.ProjectID, "project", cfg.ProjectID, "project id to provision into (env PUBSUB_PROJECT_ID)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return serve(ctx, cfg, logger, func(addr string) {})
}

// serve runs the fake until ctx is done; ready is called with the bound
// address once it accepts connections (and the topology is provisioned).
func serve(ctx context.Context, cfg config, logger *slog.Logger, ready func(addr string)) (err error) {
	srv, err := newServer(cfg.Listen)
	if err != nil {
		return err
	}
	defer func() {
		// Close stops the gRPC server (open streams end with an error the
		// clients retry) and the fake's delivery goroutines.
		if cerr := srv.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
		logger.Info("pubsub emulator stopped")
	}()

	if cfg.Provision {
		topo, err := declared.Topology()
		if err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = pubsub.ProvisionCommand(pctx, pubsub.ClientConfig{ProjectID: cfg.ProjectID, EmulatorHost: srv.Addr}, topo, logger)
		cancel()
		if err != nil {
			return err
		}
	}
	logger.Info("pubsub emulator serving", "addr", srv.Addr, "project", cfg.ProjectID, "provisioned", cfg.Provision)
	ready(srv.Addr)
	<-ctx.Done()
	logger.Info("pubsub emulator stopping", "cause", context.Cause(ctx))
	return nil
}

// newServer turns pstest's panic on a busy or bad address into an error.
func newServer(addr string) (srv *pstest.Server, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("listen on %s: %v", addr, v)
		}
	}()
	return pstest.NewServerWithAddress(addr), nil
}
