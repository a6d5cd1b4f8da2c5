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

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/pkg/gcpproject"
)

// Environment variables read by ClientConfigFromEnv.
const (
	EnvProjectID          = "PUBSUB_PROJECT_ID"
	EnvGoogleCloudProject = "GOOGLE_CLOUD_PROJECT" // fallback for the project id, the GCP convention
	EnvEmulatorHost       = "PUBSUB_EMULATOR_HOST"
	// DefaultProjectID is the project on an emulator when none is set: any
	// id works there.
	DefaultProjectID = "lossless-local"
)

// ClientConfig selects the Pub/Sub endpoint.
type ClientConfig struct {
	// ProjectID owns the topics and subscriptions. Env PUBSUB_PROJECT_ID, else
	// GOOGLE_CLOUD_PROJECT, else "lossless-local" with PUBSUB_EMULATOR_HOST
	// set (any id works on an emulator). Empty: NewClient asks the GCE/GKE
	// metadata server (see ResolveProjectID).
	ProjectID string
	// EmulatorHost is "host:port" of an emulator (pstest or the Cloud SDK
	// emulator). Env PUBSUB_EMULATOR_HOST; default empty = real GCP Pub/Sub with
	// Application Default Credentials.
	EmulatorHost string
}

// ClientConfigFromEnv reads the config; errors are collected in r.
func ClientConfigFromEnv(r *envconfig.Reader) ClientConfig {
	c := ClientConfig{
		ProjectID:    r.String(EnvProjectID, r.String(EnvGoogleCloudProject, "")),
		EmulatorHost: r.String(EnvEmulatorHost, ""),
	}
	if c.ProjectID == "" && c.EmulatorHost != "" {
		c.ProjectID = DefaultProjectID
	}
	return c
}

// Validate reports a config that cannot reach Pub/Sub. An empty ProjectID is
// valid: NewClient resolves it.
func (c ClientConfig) Validate() error {
	var errs []error
	if c.EmulatorHost != "" {
		if _, _, err := net.SplitHostPort(c.EmulatorHost); err != nil {
			errs = append(errs, envconfig.Check(EnvEmulatorHost, fmt.Errorf("want host:port: %w", err)))
		}
	}
	return errors.Join(errs...)
}

// ResolveProjectID returns cfg.ProjectID when set, else DefaultProjectID on
// an emulator, else the project id of the GCE/GKE metadata server (bounded by
// gcpproject.MetadataTimeout), else an error naming PUBSUB_PROJECT_ID. It is
// not done in ClientConfigFromEnv because it may need the network.
func ResolveProjectID(ctx context.Context, cfg ClientConfig) (string, error) {
	switch {
	case cfg.ProjectID != "":
		return cfg.ProjectID, nil
	case cfg.EmulatorHost != "":
		return DefaultProjectID, nil
	}
	id, err := gcpproject.FromMetadata(ctx)
	if err != nil {
		return "", envconfig.Check(EnvProjectID, fmt.Errorf("not set, nor %s, and not found on the metadata server: %w", EnvGoogleCloudProject, err))
	}
	return id, nil
}

// NewClient connects to the emulator when cfg.EmulatorHost is set, else to
// real Pub/Sub with Application Default Credentials, in the project of
// ResolveProjectID (the client's Project method returns it).
//
// The emulator options are passed explicitly rather than relying only on the
// library's own PUBSUB_EMULATOR_HOST hook (apiv1/emulator_hook.go), so a
// config built in code (tests, pubsubtest) reaches its emulator whatever the
// process environment says; explicit options are applied after the hook's and
// win. The converse cannot be forced: with PUBSUB_EMULATOR_HOST set in the
// environment the library targets the emulator even if cfg.EmulatorHost is
// empty, which is why ClientConfigFromEnv reads that same variable.
func NewClient(ctx context.Context, cfg ClientConfig) (*gpubsub.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("pubsub: client config: %w", err)
	}
	project, err := ResolveProjectID(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pubsub: %w", err)
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
	c, err := gpubsub.NewClient(ctx, project, opts...)
	if err != nil {
		return nil, fmt.Errorf("pubsub: new client (project %q, emulator %q): %w", project, cfg.EmulatorHost, err)
	}
	return c, nil
}
