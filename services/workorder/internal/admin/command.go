package admin

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/google/uuid"

	"github.com/lossless-dev/lossless/pkg/operator"
)

// OrdersUsage documents `workorder orders re-hand-off`, the service's own
// repair; the commands of every service are operator.RunCLI's
// (operator.CLIUsage). Running the binary with the database credentials is
// the privilege; ticket and actor make it audited.
const OrdersUsage = `usage: workorder orders <command> [flags]

commands:
  orders re-hand-off  --order UUID --ticket T --actor A
                      record a second waiting point for a HANDED_OFF order (F7)
`

// RunOrdersCLI runs `workorder orders <command>`; args start with the
// command (re-hand-off).
func RunOrdersCLI(ctx context.Context, args []string, ops *Ops, out io.Writer) error {
	if ops == nil || out == nil {
		return errors.New("admin: RunOrdersCLI needs ops and an output")
	}
	if len(args) == 0 || args[0] != "re-hand-off" {
		_, _ = io.WriteString(out, OrdersUsage)
		return fmt.Errorf("%w: unknown command %q", operator.ErrUsage, fmt.Sprint(args))
	}
	fs := flag.NewFlagSet("workorder orders re-hand-off", flag.ContinueOnError)
	fs.SetOutput(out)
	ticket := fs.String("ticket", "", "change or incident reference (required)")
	actor := fs.String("actor", "", "who acts (required)")
	order := fs.String("order", "", "work order id (required)")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %w", operator.ErrUsage, err)
	}
	oid, err := uuid.Parse(*order)
	if err != nil {
		return fmt.Errorf("%w: --order must be a work order UUID", operator.ErrUsage)
	}
	wp, open, err := ops.RecordReHandOff(ctx, *ticket, *actor, oid)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "recorded waiting point %d; work order %s now has %d open waiting points\n", wp, oid, open)
	return err
}
