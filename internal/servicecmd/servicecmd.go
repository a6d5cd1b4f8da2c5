// Package servicecmd is the command line every process shares, so that a
// service's main.go only declares what is its own:
//
//	<name> [serve [--role api|worker|all]]   load the configuration from the environment,
//	                                         set up telemetry, assemble the app and run it
//	<name> <command> ...                     the service's own commands
//
// A service with a database and Pub/Sub adds migrate, provision and the
// operator API's commands with serviceapp.CommandLine; the console uses this
// package alone, so its binary links no reader of the other services'
// variables (ADR 0016).
//
// Main reads the process's arguments and environment and returns the exit
// status (server.Main: 0, 1 after a JSON "<name> failed" line on stderr,
// or the code of a server.ExitError). A configuration error stops serve
// before anything starts, naming the variable.
package servicecmd

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/lossless-dev/lossless/internal/envconfig"
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
	// --role flag overrides (nil for a process without roles, the
	// console), and its telemetry section.
	Sections func(*C) (*server.Config, telemetry.Config)
	// Prepare resolves, after Config and before New, what the environment
	// leaves to the platform (serviceapp.CommandLine: the projects of
	// Pub/Sub and of the traces), in cfg and tel. Optional.
	Prepare func(ctx context.Context, cfg *C, tel *telemetry.Config) error
	// New assembles the app (app.New).
	New func(ctx context.Context, cfg C, logger *slog.Logger, tel telemetry.Providers, opts ...server.Option) (A, error)
	// Declaration is the service's services/<name>/service.json, which its
	// main package embeds (service.go): serviceapp.CommandLine's provision
	// creates the topics it publishes and its subscriptions
	// (catalog.Service.Topology). Empty: provision needs -system.
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
	case "-h", "--help", "help":
		fmt.Println(s.Usage)
		return nil
	}
	if c, ok := s.Commands[cmd]; ok {
		return c(ctx, env, logger, args)
	}
	return fmt.Errorf("unknown command %q; %s", cmd, s.Usage)
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
	srv, tel := s.Sections(&cfg)
	if role != "" {
		if srv == nil {
			return fmt.Errorf("--role: %s has no roles", s.Name)
		}
		srv.Role = role
	}
	if s.Prepare != nil {
		if err := s.Prepare(ctx, &cfg, &tel); err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
	}
	return server.Serve(ctx, tel, os.Stdout, func(ctx context.Context, logger *slog.Logger, tel telemetry.Providers, opts ...server.Option) (server.Process, error) {
		return s.New(ctx, cfg, logger, tel, opts...)
	})
}
