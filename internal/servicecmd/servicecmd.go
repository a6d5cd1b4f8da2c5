// Package servicecmd is the command line every service shares, so that a
// service's main.go only declares what is its own:
//
//	<name> [serve [--role api|worker|all]]   load the configuration from the environment,
//	                                         set up telemetry, assemble the app and run it
//	<name> migrate                           apply the service's migrations (DATABASE_URL), if any
//	<name> provision                         create the system's Pub/Sub topology, if it uses Pub/Sub
//	<name> outbox|parked|dead-letters|audit  the one operator API's commands (pkg/operator
//	                                         RunCLI), in process (Service.Operator)
//	<name> <command> ...                     the service's own commands
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
	"slices"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/operator"
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
	// --role flag overrides (nil for a process without roles, the
	// console), and its telemetry section.
	Sections func(*C) (*server.Config, telemetry.Config)
	// PubSub returns the configuration's Pub/Sub client section, whose
	// project serve resolves (libenv.ResolvePubSubProject: the
	// environment, else the GCE/GKE metadata server) before New; nil for a
	// service without Pub/Sub.
	PubSub func(*C) *pubsub.ClientConfig
	// New assembles the app (app.New).
	New func(ctx context.Context, cfg C, logger *slog.Logger, tel telemetry.Providers, opts ...server.Option) (A, error)
	// Migrations are the sets migrate applies (migrations.<Service>());
	// without any, the service has no migrate command.
	Migrations []pgmigrate.Set
	// Operator opens the service's operator API in process for the
	// commands outbox, parked, dead-letters and audit (nil: the service
	// has none).
	Operator OperatorCLI
	// Commands are the service's own commands by name (may be nil).
	Commands map[string]Command
}

// OperatorCLI is a service's operator hook on the command line: the one
// operator API's operations over pool (DATABASE_URL's), with its consumers
// configured as the running service's (read from env), and the consumer the
// commands name by default. ps is nil unless the command replays dead
// letters, the only one that needs Pub/Sub.
type OperatorCLI func(ctx context.Context, env *envconfig.Reader, pool *pgxpool.Pool, ps *gpubsub.Client, logger *slog.Logger) (operator.Operations, string, error)

// OpenDatabase opens a pool on DATABASE_URL for a one-shot command, after
// checking env for the errors of every variable read so far.
func OpenDatabase(ctx context.Context, env *envconfig.Reader) (*pgxpool.Pool, error) {
	dsn := env.Required("DATABASE_URL")
	if err := env.Err(); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	return pool, nil
}

// OperatorCommand runs `<name> <group> ...` (args[0] is the group) through
// open, in process: holding DATABASE_URL is the privilege (the binary could
// change these tables directly), so the calls skip the operator token, the
// network's credential; -ticket and -actor make each repair audited.
func OperatorCommand(open OperatorCLI) Command {
	return func(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
		psCfg := libenv.PubSub(env)
		pool, err := OpenDatabase(ctx, env)
		if err != nil {
			return err
		}
		defer pool.Close()
		var ps *gpubsub.Client
		if len(args) > 0 && args[0] == "dead-letters" {
			if ps, err = libenv.PubSubClient(ctx, psCfg); err != nil {
				return err
			}
			defer func() { _ = ps.Close() }()
		}
		ops, consumer, err := open(ctx, env, pool, ps, logger)
		if err != nil {
			return err
		}
		return operator.RunCLI(ctx, args, ops, consumer, os.Stdout)
	}
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
		if len(s.Migrations) == 0 {
			break
		}
		return libenv.Migrate(ctx, env, logger, s.Migrations...)
	case "provision":
		if s.PubSub == nil {
			break
		}
		cfg := libenv.PubSub(env)
		if err := env.Err(); err != nil {
			return err
		}
		cfg, err := libenv.ResolvePubSubProject(ctx, cfg)
		if err != nil {
			return err
		}
		return pubsub.ProvisionCommand(ctx, cfg, topology.System(), logger)
	case "-h", "--help", "help":
		fmt.Println(s.Usage)
		return nil
	}
	if c, ok := s.Commands[cmd]; ok {
		return c(ctx, env, logger, args)
	}
	if s.Operator != nil && slices.Contains([]string{"outbox", "parked", "dead-letters", "audit"}, cmd) {
		return OperatorCommand(s.Operator)(ctx, env, logger, append([]string{cmd}, args...))
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
	if s.PubSub != nil {
		ps := s.PubSub(&cfg)
		if *ps, err = libenv.ResolvePubSubProject(ctx, *ps); err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
	}
	srv, tel := s.Sections(&cfg)
	if role != "" {
		if srv == nil {
			return fmt.Errorf("--role: %s has no roles", s.Name)
		}
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
