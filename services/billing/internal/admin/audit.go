package admin

import (
	"errors"
	"fmt"

	"github.com/lossless-dev/lossless/pkg/operator"
)

// ErrInvalidRequest is returned for an operator request that is incomplete
// or out of bounds; nothing was changed.
var ErrInvalidRequest = errors.New("admin: invalid request")

// Authorization names who runs a privileged operation under which change or
// incident ticket; both are required and recorded.
type Authorization struct {
	Ticket, Actor string
}

// Validate reports a missing, overlong or unstorable ticket or actor.
func (a Authorization) Validate() error {
	if err := operator.ValidateAuthorization(a.Ticket, a.Actor); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return nil
}
