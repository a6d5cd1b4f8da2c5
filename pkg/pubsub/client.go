// Package pubsub is the Google Cloud Pub/Sub plumbing every service shares: the
// client (emulator or real GCP), the declared topology and its idempotent
// provisioning, a publisher that awaits every result, and a subscriber whose
// handler result alone decides ack or nack.
//
// The same code runs against the pstest-based emulator (cmd/pubsub-emulator),
// the official Cloud SDK emulator and real Pub/Sub; only PUBSUB_EMULATOR_HOST
// and the project id differ. What the emulators do not implement, and what
// covers each gap, is in docs/adr/0004-pubsub-emulator.md; the message
// contract is in docs/adr/0005-message-contract.md.
//
// Lesson: with at-least-once delivery the ack is the commit point of the
// consumer, so only the handler's result may give it, and only after the
// handler stored what it received. Guards H4 (a handler call is bounded by
// MaxBatchBytes), the ack-after-store half of I2 (with F10: a lost ack is a
// redelivery, never a loss), I7's dead-letter depth (DeadLetterMonitor), and
// N5's subscriber side: with WithOwnConnection a subscriber probes its own
// connection and replaces a dead one within ProbeInterval + ProbeTimeout
// (docs/adr/0022-bounded-waits-on-dead-connections.md).
package pubsub

import (
	"context"
	"errors"
	"fmt"
	"net"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// DefaultProjectID is the project on an emulator when none is set: any id
// works there.
const DefaultProjectID = "lossless-local"

// ClientConfig selects the Pub/Sub endpoint.
type ClientConfig struct {
	// ProjectID owns the topics and subscriptions. Required on real
	// Pub/Sub; empty with EmulatorHost set means DefaultProjectID (any id
	// works on an emulator). The services read it from PUBSUB_PROJECT_ID or
	// GOOGLE_CLOUD_PROJECT, else ask the GCE/GKE metadata server.
	ProjectID string
	// EmulatorHost is "host:port" of an emulator (pstest or the Cloud SDK
	// emulator); the services read PUBSUB_EMULATOR_HOST. Default empty =
	// real GCP Pub/Sub with Application Default Credentials.
	EmulatorHost string
}

// Validate reports a config that cannot reach Pub/Sub. An empty ProjectID is
// valid: the services resolve it before NewClient, which requires it on real
// Pub/Sub.
func (c ClientConfig) Validate() error {
	var errs []error
	if c.EmulatorHost != "" {
		if _, _, err := net.SplitHostPort(c.EmulatorHost); err != nil {
			errs = append(errs, fmt.Errorf("PUBSUB_EMULATOR_HOST: want host:port: %w", err))
		}
	}
	return errors.Join(errs...)
}

// NewClient connects to the emulator when cfg.EmulatorHost is set, else to
// real Pub/Sub with Application Default Credentials, in cfg.ProjectID
// (DefaultProjectID on an emulator when empty; the client's Project method
// returns it).
//
// The emulator options are passed explicitly rather than relying only on the
// library's own PUBSUB_EMULATOR_HOST hook (apiv1/emulator_hook.go), so a
// config built in code (tests, pubsubtest) reaches its emulator whatever the
// process environment says; explicit options are applied after the hook's and
// win. The converse cannot be forced: with PUBSUB_EMULATOR_HOST set in the
// environment the library targets the emulator even if cfg.EmulatorHost is
// empty, which is why the services read that same variable into cfg.
func NewClient(ctx context.Context, cfg ClientConfig) (*gpubsub.Client, error) {
	return newClient(ctx, cfg)
}

// newClient is NewClient with extra options, applied last.
func newClient(ctx context.Context, cfg ClientConfig, extra ...option.ClientOption) (*gpubsub.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("pubsub: client config: %w", err)
	}
	project := cfg.ProjectID
	switch {
	case project == "" && cfg.EmulatorHost != "":
		project = DefaultProjectID
	case project == "":
		return nil, errors.New("pubsub: PUBSUB_PROJECT_ID: project id is empty (required on real Pub/Sub)")
	}
	var opts []option.ClientOption
	if cfg.EmulatorHost != "" {
		opts = append(opts,
			option.WithEndpoint(cfg.EmulatorHost),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
			option.WithoutAuthentication(),
			option.WithTelemetryDisabled(),
		)
	}
	c, err := gpubsub.NewClient(ctx, project, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("pubsub: new client (project %q, emulator %q): %w", project, cfg.EmulatorHost, err)
	}
	return c, nil
}
