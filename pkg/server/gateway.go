package server

import (
	"context"
	"math"
	"net/http"
	"net/textproto"
	"strconv"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/apierror"
)

// GatewayErrorHandler maps gRPC errors to HTTP the standard way
// (runtime.HTTPStatusFromCode), except for reasons HTTP can say better than
// gRPC: a reused Idempotency-Key with a different body is 422 Unprocessable
// Content, a key whose first request is still in flight is 409 Conflict
// (IETF httpapi idempotency-key draft), an UNAUTHENTICATED answer (401)
// carries WWW-Authenticate: Bearer (RFC 6750), a body over the size limit is 413 and
// a body not received within the read timeout is 408 (whatever error the
// body's decoder made of them). A google.rpc.RetryInfo becomes a Retry-After
// header (whole seconds). The body stays the google.rpc.Status with its
// details, so field violations reach REST clients too.
func GatewayErrorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if bodyErr := bodyError(r); bodyErr != nil {
		err = bodyErr
	}
	if d := apierror.RetryAfter(err); d > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
	}
	if status.Code(err) == codes.Unauthenticated {
		// RFC 6750 section 3: a 401 names the scheme the client should use.
		// The default handler would put the status message there instead.
		w = bearerChallenge{w}
	}
	switch apierror.Reason(err) {
	case apierror.ReasonIdempotencyKeyMismatch:
		err = &runtime.HTTPStatusError{HTTPStatus: http.StatusUnprocessableEntity, Err: err}
	case apierror.ReasonIdempotencyKeyInFlight:
		err = &runtime.HTTPStatusError{HTTPStatus: http.StatusConflict, Err: err}
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}

// HeaderMatcher forwards the HTTP headers our gRPC services read as metadata:
// Idempotency-Key, W3C trace context, plus grpc-gateway's defaults
// (Authorization and Grpc-Metadata-* among them).
func HeaderMatcher(key string) (string, bool) {
	switch textproto.CanonicalMIMEHeaderKey(key) {
	case "Idempotency-Key":
		return "idempotency-key", true
	case "Traceparent":
		return "traceparent", true
	case "Tracestate":
		return "tracestate", true
	}
	return runtime.DefaultHeaderMatcher(key)
}

// bearerChallenge sets WWW-Authenticate: Bearer as the response's headers
// are written, over whatever the default error handler put there.
type bearerChallenge struct{ http.ResponseWriter }

func (b bearerChallenge) WriteHeader(code int) {
	b.Header().Set("WWW-Authenticate", `Bearer realm="lossless"`)
	b.ResponseWriter.WriteHeader(code)
}
