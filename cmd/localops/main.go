// Command localops is what `make psql`, `make ops`, `make metrics` and `make
// trace` run: it finds the stack `make run` started through its env file
// (internal/devtools/runenv: .run/env, or RUNLOCAL_ENV_FILE) and fails, saying so,
// when none is running.
//
// Usage:
//
//	localops psql <service> [psql args]   psql on the service's database
//	localops ops <service> [args]         the service's command line (e.g. inbox list --status PARKED)
//	                                      with the stack's DATABASE_URL, Pub/Sub emulator and tokens
//	localops metrics                      the stall gauges of every service, one table
//	localops trace [-queries] <order id>  the order's spans as a tree, across linked traces
//	                                      (database spans counted, or with -queries shown)
//	localops token [audience]             an ID token of the demo client from the local issuer,
//	                                      for audience (default workorder): curl's bearer token
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/lossless-dev/lossless/internal/devtools/localops"
	"github.com/lossless-dev/lossless/internal/devtools/runenv"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

const usage = "usage: localops psql <service> [args] | ops <service> [args] | metrics | trace [-queries] <order id> | token [audience]"

func run(args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	env, err := runenv.Load(runenv.Path(os.Getenv))
	if err != nil {
		return err
	}
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		return ""
	}
	rest := func(i int) []string {
		if i < len(args) {
			return args[i:]
		}
		return nil
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "psql":
		cmd, err := localops.PsqlCommand(env, arg(1), rest(2))
		if err != nil {
			return err
		}
		return exec(cmd)
	case "ops":
		cmd, err := localops.OpsCommand(env, arg(1), rest(2))
		if err != nil {
			return err
		}
		return exec(cmd)
	case "metrics":
		return localops.Metrics(ctx, env, os.Stdout)
	case "trace":
		if arg(1) == "-queries" {
			return localops.Trace(ctx, env, arg(2), true, os.Stdout)
		}
		return localops.Trace(ctx, env, arg(1), false, os.Stdout)
	case "token":
		return localops.Token(ctx, env, arg(1), os.Stdout)
	default:
		return fmt.Errorf("unknown command %q; %s", args[0], usage)
	}
}

// exec replaces this process with cmd: an interactive psql gets the
// terminal and its Ctrl-C, and cmd's exit status is the target's.
func exec(cmd localops.Command) error {
	argv := append([]string{cmd.Path}, cmd.Args...)
	return fmt.Errorf("exec %s: %w", cmd.Path, syscall.Exec(cmd.Path, argv, cmd.Env))
}
