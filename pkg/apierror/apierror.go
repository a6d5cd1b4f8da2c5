// Package apierror builds the gRPC errors of every lossless API, so clients
// (and the HTTP gateway) see one consistent shape: a status code plus
// machine-readable details (google.rpc.BadRequest field violations,
// google.rpc.ErrorInfo reasons).
//
// Lesson: an API error is a contract, not a log line: a client must be able
// to tell "fix this field" from "retry later" from the code and details alone,
// and never sees database text. Guards F15 (an outage answers UNAVAILABLE
// "database unavailable; retry" with a retry delay, which the gateway turns
// into 503 and Retry-After; Public hides the cause) and H7 (hostile request
// text is a 400 whose field violations name the field).
package apierror

import (
	"context"
	"errors"
	"fmt"
	"time"

	"buf.build/go/protovalidate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lossless-dev/lossless/pkg/pgdb"
)

// Domain is the ErrorInfo domain of every reason this system emits.
const Domain = "lossless.dev"

// Reasons carried in google.rpc.ErrorInfo. The gateway maps some to HTTP codes
// that gRPC codes cannot express.
const (
	// ReasonIdempotencyKeyMismatch: an Idempotency-Key reused with a different
	// request (HTTP 422, IETF httpapi idempotency-key draft).
	ReasonIdempotencyKeyMismatch = "IDEMPOTENCY_KEY_MISMATCH"
	// ReasonIdempotencyKeyInFlight: the first request with this key is still
	// being processed (HTTP 409).
	ReasonIdempotencyKeyInFlight = "IDEMPOTENCY_KEY_IN_FLIGHT"
)

// Violation is one invalid field: its path in proto field-name form
// ("work_order.unit_price.currency_code") and why it is invalid.
type Violation struct {
	Field       string
	Description string
}

// InvalidArgument returns INVALID_ARGUMENT with one field violation per entry.
func InvalidArgument(violations ...Violation) error {
	br := &errdetails.BadRequest{}
	msg := "invalid request:"
	for _, v := range violations {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{
			Field:       v.Field,
			Description: v.Description,
		})
		msg += fmt.Sprintf(" %s: %s;", v.Field, v.Description)
	}
	return withDetails(codes.InvalidArgument, msg, br)
}

// FromValidation converts a protovalidate error into INVALID_ARGUMENT with one
// field violation per bad field: a field that breaks several rules (an empty
// customer_id fails both min_len and pattern) gets one violation whose
// description lists every broken rule. Other errors pass through unchanged.
func FromValidation(err error) error {
	var verr *protovalidate.ValidationError
	if !errors.As(err, &verr) {
		return err
	}
	vs := make([]Violation, 0, len(verr.Violations))
	index := map[string]int{}
	for _, v := range verr.Violations {
		field := protovalidate.FieldPathString(v.Proto.GetField())
		if field == "" {
			// Message-level (CEL) rules have no field; name the rule instead.
			field = v.Proto.GetRuleId()
		}
		if i, seen := index[field]; seen {
			vs[i].Description += "; " + v.Proto.GetMessage()
			continue
		}
		index[field] = len(vs)
		vs = append(vs, Violation{Field: field, Description: v.Proto.GetMessage()})
	}
	return InvalidArgument(vs...)
}

// NotFound returns NOT_FOUND for the resource kind and id.
func NotFound(kind, id string) error {
	return status.Errorf(codes.NotFound, "%s %q not found", kind, id)
}

// FailedPrecondition returns FAILED_PRECONDITION with an ErrorInfo reason, for
// requests that are valid but not allowed in the resource's current state.
func FailedPrecondition(reason, msg string) error {
	return withDetails(codes.FailedPrecondition, msg, &errdetails.ErrorInfo{Reason: reason, Domain: Domain})
}

// PermissionDenied is PERMISSION_DENIED (HTTP 403) with an ErrorInfo of
// reason: the caller is known but may not do this.
func PermissionDenied(reason, msg string) error {
	return withDetails(codes.PermissionDenied, msg, &errdetails.ErrorInfo{Reason: reason, Domain: Domain})
}

// Aborted returns ABORTED with an ErrorInfo reason (HTTP 409): retry later.
func Aborted(reason, msg string) error {
	return withDetails(codes.Aborted, msg, &errdetails.ErrorInfo{Reason: reason, Domain: Domain})
}

// Reason returns the ErrorInfo reason carried by err, or "".
func Reason(err error) string {
	s, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range s.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

func withDetails(code codes.Code, msg string, details ...protoadapt.MessageV1) error {
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil {
		// Only fails on a detail that cannot be marshalled; keep the code.
		return status.Error(code, msg)
	}
	return st.Err()
}

// ReasonDatabaseUnavailable is the ErrorInfo reason of UNAVAILABLE answers
// caused by a database outage or overload.
const ReasonDatabaseUnavailable = "DATABASE_UNAVAILABLE"

// RetryDelay is the retry hint of UNAVAILABLE answers (google.rpc.RetryInfo;
// HTTP Retry-After): long enough for a restarted PostgreSQL or a pool with a
// free connection, short enough not to stall a client.
const RetryDelay = time.Second

// Unavailable returns UNAVAILABLE "database unavailable; retry" with a
// RetryInfo of RetryDelay: the request did nothing and may be repeated.
func Unavailable() error {
	return withDetails(codes.Unavailable, "database unavailable; retry",
		&errdetails.ErrorInfo{Reason: ReasonDatabaseUnavailable, Domain: Domain},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(RetryDelay)})
}

// RetryAfter returns the RetryInfo delay carried by err, or 0.
func RetryAfter(err error) time.Duration {
	s, ok := status.FromError(err)
	if !ok {
		return 0
	}
	for _, d := range s.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			return r.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// Public maps a handler's error to the one its client may see:
//
//   - a gRPC status passes unchanged: handlers chose it;
//   - the client's cancellation (ctx cancelled) is CANCELLED;
//   - a database outage or overload ([pgdb.IsUnavailable]: connection
//     refused or lost, shutdown, too many connections, pool acquire,
//     statement or request deadline) is [Unavailable];
//   - anything else is INTERNAL "internal error", with ref (a trace or
//     request id) when not empty, so the client can quote it.
//
// Only the first case keeps err's text: driver errors carry SQL, hosts and
// user names. hidden reports that err's text was dropped and must be logged.
func Public(ctx context.Context, err error, ref string) (public error, hidden bool) {
	if err == nil {
		return nil, false
	}
	if _, ok := status.FromError(err); ok {
		return err, false
	}
	if errors.Is(err, context.Canceled) || errors.Is(ctx.Err(), context.Canceled) {
		return status.Error(codes.Canceled, "request cancelled"), false
	}
	if pgdb.IsUnavailable(err) {
		return Unavailable(), true
	}
	msg := "internal error"
	if ref != "" {
		msg += " (ref " + ref + ")"
	}
	return status.Error(codes.Internal, msg), true
}
