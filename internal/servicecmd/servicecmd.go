// Package servicecmd is the command line every service shares, so that a
// service's main.go only declares what is its own:
//
//	<name> [serve [--role api|worker|all]]   load the configuration from the environment,
//	                                         set up telemetry, assemble the app and run it
//	<name> migrate                           apply the service's migrations (DATABASE_URL)
//	<name> provision [-system DIR]           create the service's part of the Pub/Sub topology
//	                                         (-system: every service's, from DIR/*/service.json)
//	<name> <command> ...                     the service's operator commands
//
// Main reads the process's arguments and environment and returns the exit
// status (server.Main: 0, 1 after a JSON "<name> failed" line on stderr,
// or the code of a server.ExitError). A configuration error stops serve
// before anything starts, naming the variable.
package servicecmd

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/lossless-dev/lossless/internal/catalog"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Command is one of a service's own commands: args are those after its
// name; logger is the one-shot commands' JSON logger (on stderr, leaving
// stdout to the command's output).
type Command func(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error

// Service declares a service's command line. C is its configuration, A its
// assembled app.
type Service[C any, A server.Process] struct {
	// Name is the service's name (config.ServiceName): the logs' service
	// field and the "<Name> failed" line.
	Name string
	// Usage is what help prints; an unknown command's error ends with it.
	Usage string
	// Config reads and validates the configuration (config.FromEnv); its
	// errors name the variable.
	Config func(*envconfig.Reader) (C, error)
	// Sections returns the configuration's server section, whose Role the
	// --role flag overrides, and its telemetry section.
	Sections func(*C) (*server.Config, telemetry.Config)
	// PubSub returns the configuration's Pub/Sub client section, whose
	// project serve resolves (libenv.ResolvePubSubProject: the
	// environment, else the GCE/GKE metadata server) before New; nil for a
	// service without Pub/Sub.
	PubSub func(*C) *pubsub.ClientConfig
	// New assembles the app (app.New).
	New func(ctx context.Context, cfg C, logger *slog.Logger, tel telemetry.Providers, opts ...server.Option) (A, error)
	// Migrations are the sets migrate applies (migrations.<Service>()).
	Migrations []pgmigrate.Set
	// Declaration is the service's services/<name>/service.json, which its
	// main package embeds: provision creates the topics it publishes and its
	// subscriptions (catalog.Service.Topology). Empty: provision needs -system.
	Declaration []byte
	// Commands are the service's own commands by name (may be nil).
	Commands map[string]Command
}

// Main runs the command line of the process (os.Args, the environment) and
// returns its exit status: a service's main is os.Exit(servicecmd.Main(...)).
func Main[C any, A server.Process](s Service[C, A]) int {
	return server.Main(s.Name, os.Stderr, func(ctx context.Context) error {
		return s.Run(ctx, envconfig.New(), os.Args[1:])
	})
}

// Run runs the command args names (serve when none) with configuration from
// env.
func (s Service[C, A]) Run(ctx context.Context, env *envconfig.Reader, args []string) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	logger := telemetry.NewLogger(os.Stderr, slog.LevelInfo).With("service", s.Name)
	switch cmd {
	case "serve":
		return s.serve(ctx, env, args)
	case "migrate":
		return libenv.Migrate(ctx, env, logger, s.Migrations...)
	case "provision":
		topo, err := s.provisioned(args)
		if err != nil {
			return err
		}
		cfg := libenv.PubSub(env)
		if err := env.Err(); err != nil {
			return err
		}
		cfg, err = libenv.ResolvePubSubProject(ctx, cfg)
		if err != nil {
			return err
		}
		return pubsub.ProvisionCommand(ctx, cfg, topo, logger)
	case "-h", "--help", "help":
		fmt.Println(s.Usage)
		return nil
	}
	if c, ok := s.Commands[cmd]; ok {
		return c(ctx, env, logger, args)
	}
	return fmt.Errorf("unknown command %q; %s", cmd, s.Usage)
}

// provisioned is what provision creates: the service's own part of the
// topology, or with -system DIR the whole system's as DIR/<name>/service.json
// declare it (one job provisioning an emulator for every service, as
// compose's: the binary embeds only its own declaration).
func (s Service[C, A]) provisioned(args []string) (pubsub.Topology, error) {
	fs := flag.NewFlagSet(s.Name+" provision", flag.ContinueOnError)
	system := fs.String("system", "", "create every service's part, as `DIR`/*/service.json declare them")
	if err := fs.Parse(args); err != nil {
		return pubsub.Topology{}, err
	}
	if fs.NArg() > 0 {
		return pubsub.Topology{}, fmt.Errorf("provision: unexpected arguments %q", fs.Args())
	}
	if *system != "" {
		c, err := catalog.Load(*system)
		if err != nil {
			return pubsub.Topology{}, err
		}
		return c.Topology(), nil
	}
	if len(s.Declaration) == 0 {
		return pubsub.Topology{}, fmt.Errorf("%s embeds no declaration to provision; %s", s.Name, s.Usage)
	}
	decl, err := catalog.ParseService(s.Declaration)
	if err != nil {
		return pubsub.Topology{}, err
	}
	if decl.Name != s.Name {
		return pubsub.Topology{}, fmt.Errorf("%s embeds the declaration of %q", s.Name, decl.Name)
	}
	return decl.Topology(), nil
}

func (s Service[C, A]) serve(ctx context.Context, env *envconfig.Reader, args []string) error {
	role, err := server.ParseServeFlags(args)
	if err != nil {
		return err
	}
	cfg, err := s.Config(env)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if s.PubSub != nil {
		ps := s.PubSub(&cfg)
		if *ps, err = libenv.ResolvePubSubProject(ctx, *ps); err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
	}
	srv, tel := s.Sections(&cfg)
	if role != "" {
		srv.Role = role
	}
	if tel.ProjectID == "" && s.PubSub != nil {
		tel.ProjectID = s.PubSub(&cfg).ProjectID // the traces' project is the system's
	}
	if tel, err = libenv.ResolveTelemetryProject(ctx, tel); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	return server.Serve(ctx, tel, os.Stdout, func(ctx context.Context, logger *slog.Logger, tel telemetry.Providers, opts ...server.Option) (server.Process, error) {
		return s.New(ctx, cfg, logger, tel, opts...)
	})
}
