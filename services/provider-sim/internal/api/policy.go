package api

import (
	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/pkg/authz"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
)

// Policy is the authorization rule of every method this server serves
// but the shared ones (docs/adr/0025-authorization.md): ProviderService is
// the work-order service's alone (Peer: PROVIDER_ALLOWED_CALLERS); the
// admin and operator services are Operator, guarded by the operator token
// (GetFaults open, OpenAdminMethods). A method added to a service needs
// its line here, or it is refused (and the app does not start).
func Policy() authz.Policy {
	return authz.Policy{
		providerv1.ProviderService_SubmitWorkOrder_FullMethodName: authz.Peer,
	}.With(authz.Operator, &providerv1.ProviderAdminService_ServiceDesc, &opsv1.OperatorService_ServiceDesc)
}

// ReasonCallerNotAllowed is the ErrorInfo reason of a SubmitWorkOrder from
// an authenticated caller outside PROVIDER_ALLOWED_CALLERS.
const ReasonCallerNotAllowed = authz.ReasonCallerNotAllowed
