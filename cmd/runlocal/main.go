// Command runlocal is `make run`: the whole system as local processes, no
// Docker. PostgreSQL comes from the local binaries (or DATABASE_URL), Pub/Sub
// from the emulator we ship (or PUBSUB_EMULATOR_HOST). Ctrl-C stops every
// process and removes the ephemeral cluster.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/lossless-dev/lossless/internal/localstack"
	"github.com/lossless-dev/lossless/pkg/pgcluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "make run:", err)
		if errors.Is(err, pgcluster.ErrNoBinaries) {
			fmt.Fprintln(os.Stderr, "\nInstall PostgreSQL: sudo apt-get install -y postgresql   (or set DATABASE_URL)")
		}
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	binDir, err := os.MkdirTemp("", "lossless-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	fmt.Println("building binaries ...")
	if err := localstack.Build(ctx, ".", binDir); err != nil {
		return err
	}
	stack, err := localstack.Start(ctx, localstack.Config{
		BinDir:        binDir,
		DatabaseURL:   os.Getenv("DATABASE_URL"),
		EmulatorHost:  os.Getenv("PUBSUB_EMULATOR_HOST"),
		ProjectID:     os.Getenv("PUBSUB_PROJECT_ID"),
		OperatorToken: os.Getenv("WORKORDER_OPERATOR_TOKEN"),
	})
	if err != nil {
		return err
	}
	urls, grpcAddrs := stack.URLs(), stack.GRPCAddrs()
	fmt.Printf(`
lossless is running. Ctrl-C stops everything.

  work orders  REST %s/v1/work-orders    gRPC %s
  provider     REST %s/v1/faults         gRPC %s
  billing      REST %s/v1/invoices       gRPC %s
  metrics      %s/metrics  %s/metrics  %s/metrics
  Pub/Sub emulator  %s

Try:  make demo        (or: curl -X POST %s/v1/work-orders -d '{"customer_id":"acme","description":"paint","positions":3,"unit_price":{"currency_code":"EUR","minor_units":1250}}')

`, urls["workorder"], grpcAddrs["workorder"], urls["provider-sim"], grpcAddrs["provider-sim"], urls["billing"], grpcAddrs["billing"],
		urls["workorder"], urls["provider-sim"], urls["billing"], stack.Emulator, urls["workorder"])

	<-ctx.Done()
	fmt.Println("\nstopping ...")
	if err := stack.Stop(30 * time.Second); err != nil {
		return fmt.Errorf("unclean shutdown: %w", err)
	}
	fmt.Println("stopped; nothing left running")
	return nil
}
