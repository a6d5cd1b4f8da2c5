package serviceapp

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lossless-dev/lossless/internal/catalog"
	"github.com/lossless-dev/lossless/internal/envconfig"
	"github.com/lossless-dev/lossless/internal/libenv"
	"github.com/lossless-dev/lossless/internal/servicecmd"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/pkg/pgmigrate"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/pkg/telemetry"
)

// Commands are what the command line of a service with a database and
// Pub/Sub adds to internal/servicecmd's.
type Commands[C any] struct {
	// PubSub returns the configuration's Pub/Sub client section, whose
	// project serve resolves (libenv.ResolvePubSubProject: the
	// environment, else the GCE/GKE metadata server) before New; the
	// traces' project is the same unless set.
	PubSub func(*C) *pubsub.ClientConfig
	// Migrations are the sets `migrate` applies (migrations.<Service>()).
	Migrations []pgmigrate.Set
	// Operator is the operator hook on the command line: `outbox`,
	// `parked`, `dead-letters` and `audit` run the one operator API in
	// process through it (OperatorCommand). Optional.
	Operator OperatorCLI
}

// CommandLine is s with c's commands: `migrate` (DATABASE_URL), `provision
// [-system DIR]` (the service's part of the Pub/Sub topology, from
// s.Declaration; -system: every service's, from DIR/*/service.json), the
// operator API's commands, and serve
// resolving the projects before New. s's own Commands win over these.
func CommandLine[C any, A server.Process](s servicecmd.Service[C, A], c Commands[C]) servicecmd.Service[C, A] {
	cmds := map[string]servicecmd.Command{
		"migrate": func(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, _ []string) error {
			return libenv.Migrate(ctx, env, logger, c.Migrations...)
		},
		"provision": func(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
			topo, err := provisioned(s.Name, s.Usage, s.Declaration, args)
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
		},
	}
	if c.Operator != nil {
		for _, group := range operator.CLIGroups {
			cmds[group] = func(ctx context.Context, env *envconfig.Reader, logger *slog.Logger, args []string) error {
				return OperatorCommand(c.Operator)(ctx, env, logger, append([]string{group}, args...))
			}
		}
	}
	maps.Copy(cmds, s.Commands)
	s.Commands = cmds
	s.Prepare = func(ctx context.Context, cfg *C, tel *telemetry.Config) error {
		var err error
		if c.PubSub != nil {
			ps := c.PubSub(cfg)
			if *ps, err = libenv.ResolvePubSubProject(ctx, *ps); err != nil {
				return err
			}
			if tel.ProjectID == "" {
				tel.ProjectID = ps.ProjectID // the traces' project is the system's
			}
		}
		*tel, err = libenv.ResolveTelemetryProject(ctx, *tel)
		return err
	}
	return s
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
// open, in process: holding DATABASE_URL is the privilege for reads; a
// repair is recorded as the operator the environment authenticates
// (OPERATOR_ID_TOKEN, OPERATOR_ID_TOKEN_FILE, OPERATOR_TOKEN_URL with
// OPERATOR_CLIENT_ID/_SECRET, or OPERATOR_BREAK_GLASS=true; operatorlogin.go)
// and refused without one. -ticket makes each repair audited.
func OperatorCommand(open OperatorCLI) servicecmd.Command {
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
		if ops, err = operatorLogIn(ctx, env, ops, logger); err != nil {
			return err
		}
		return operator.RunCLI(ctx, args, ops, consumer, os.Stdout)
	}
}

// provisioned is the topology `<name> provision [-system DIR]` creates: the
// service's own part, from its embedded declaration, or with -system every
// service's, as DIR/*/service.json declare them.
func provisioned(name, usage string, declaration []byte, args []string) (pubsub.Topology, error) {
	fs := flag.NewFlagSet(name+" provision", flag.ContinueOnError)
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
	if len(declaration) == 0 {
		return pubsub.Topology{}, fmt.Errorf("%s embeds no declaration to provision; %s", name, usage)
	}
	decl, err := catalog.ParseService(declaration)
	if err != nil {
		return pubsub.Topology{}, err
	}
	if decl.Name != name {
		return pubsub.Topology{}, fmt.Errorf("%s embeds the declaration of %q", name, decl.Name)
	}
	return decl.Topology(), nil
}
