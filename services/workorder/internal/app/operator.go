package app

import (
	"github.com/lossless-dev/lossless/internal/serviceapp"
	"github.com/lossless-dev/lossless/pkg/operator"
	"github.com/lossless-dev/lossless/services/workorder/internal/admin"
	"github.com/lossless-dev/lossless/services/workorder/internal/invoicing"
)

// operatorService builds the one operator API (pkg/operator) over the
// work-order database (admin.OperatorDeps, as the CLI runs it), behind the
// operator token.
func operatorService(p *serviceapp.Parts, token string, inv *invoicing.Invoicing) (*operator.Service, error) {
	deps, err := admin.OperatorDeps(p.DB.Workers, inv, p.PubSub, p.Log.With("component", "operator"))
	if err != nil {
		return nil, err
	}
	deps.Token = token
	return operator.NewService(deps)
}
