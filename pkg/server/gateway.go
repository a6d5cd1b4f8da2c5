package server

import (
	"context"
	"math"
	"net/http"
	"net/textproto"
	"strconv"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	"github.com/lossless-dev/lossless/pkg/apierror"
)

// GatewayErrorHandler maps gRPC errors to HTTP the standard way
// (runtime.HTTPStatusFromCode), except for reasons HTTP can say better than
// gRPC: a reused Idempotency-Key with a different body is 422 Unprocessable
// Content, a key whose first request is still in flight is 409 Conflict
// (IETF httpapi idempotency-key draft), a body over the size limit is 413 and
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
