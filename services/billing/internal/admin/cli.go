package admin

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// CLIUsage documents `billing jobs retry`, billing's own operator command.
// The generic ones (`billing outbox|parked|dead-letters|audit ...`) are
// operator.RunCLI's (operator.CLIUsage). Running the binary with the
// database credentials is the privilege; ticket and actor make each run
// audited (operator_audit).
const CLIUsage = `usage: billing jobs <command> [flags]

commands:
  jobs retry          -id N [-id M ...] -ticket T -actor A [-dry-run]
                      requeue dead invoice jobs with a fresh attempt budget
`

// ErrUsage is returned for a malformed command line.
var ErrUsage = errors.New("usage")

// RunCLI runs `billing jobs <command> [flags]`; args start with the command
// (retry).
func RunCLI(ctx context.Context, args []string, ops *Ops, out io.Writer) error {
	if ops == nil || out == nil {
		return errors.New("admin: RunCLI needs ops and an output")
	}
	if len(args) == 0 || args[0] != "retry" {
		_, _ = io.WriteString(out, CLIUsage)
		return fmt.Errorf("%w: unknown command %q", ErrUsage, strings.TrimSpace("jobs "+strings.Join(args, " ")))
	}
	fs := flag.NewFlagSet("billing jobs retry", flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		a      Authorization
		dryRun bool
		jobIDs jobIDList
	)
	fs.StringVar(&a.Ticket, "ticket", "", "change or incident reference (required)")
	fs.StringVar(&a.Actor, "actor", "", "who acts (required)")
	fs.BoolVar(&dryRun, "dry-run", false, "report, change nothing")
	fs.Var(&jobIDs, "id", "dead job id to requeue (repeatable, required)")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	ids, err := ops.RetryJobs(ctx, RetryJobsRequest{Authorization: a, IDs: jobIDs, DryRun: dryRun})
	if err != nil {
		return err
	}
	return json.NewEncoder(out).Encode(map[string]any{"requested": []int64(jobIDs), "dry_run": dryRun, "requeued": ids})
}

// jobIDList collects a repeated -id flag.
type jobIDList []int64

func (l *jobIDList) String() string { return fmt.Sprint(*l) }

func (l *jobIDList) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return fmt.Errorf("job id %q: want a positive integer", s)
	}
	*l = append(*l, n)
	return nil
}
