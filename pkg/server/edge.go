package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/apierror"
)

// ReasonBodyTooLarge is the ErrorInfo reason of a request refused with 413.
const ReasonBodyTooLarge = "REQUEST_BODY_TOO_LARGE"

// outageLogInterval spaces the log lines of UNAVAILABLE answers per method:
// during an outage every request fails the same way, and one line per method
// every few seconds says so without flooding the log.
const outageLogInterval = 10 * time.Second

// publicErrorsUnary makes every handler error one a client may see (see
// apierror.Public) and logs the real error of those it hides, with the
// reference the client got.
func publicErrorsUnary(logger *slog.Logger) grpc.UnaryServerInterceptor {
	outages := newLogThrottle(outageLogInterval)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err == nil {
			return resp, nil
		}
		ref := requestRef(ctx)
		public, hidden := apierror.Public(ctx, err, ref)
		if !hidden {
			return resp, public
		}
		if status.Code(public) == codes.Unavailable {
			if ok, skipped := outages.allow(info.FullMethod, time.Now()); ok {
				logger.WarnContext(ctx, "request failed: database unavailable", "method", info.FullMethod,
					"error", err, "similar_failures_not_logged", skipped)
			}
			return resp, public
		}
		logger.ErrorContext(ctx, "request failed", "method", info.FullMethod, "ref", ref, "error", err)
		return resp, public
	}
}

// requestRef is the trace id of ctx's span when there is one (so the
// client's reference finds the trace), else a random id found only in the log.
func requestRef(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// deadlineUnary runs handlers under at most d: a client deadline that is
// shorter stays (context.WithTimeout keeps the earlier one).
func deadlineUnary(d time.Duration) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return handler(ctx, req)
	}
}

// boundedBody is a request body capped by http.MaxBytesReader that remembers
// why reading it failed, so the gateway's error handler can answer 413 or 408
// instead of the decoder's "invalid argument" with the transport's text.
type boundedBody struct {
	io.ReadCloser
	limit    int64
	tooLarge bool
	timedOut bool
}

func (b *boundedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		var tooLarge *http.MaxBytesError
		var netErr net.Error
		switch {
		case errors.As(err, &tooLarge):
			b.tooLarge = true
		case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
			b.timedOut = true
		}
	}
	return n, err
}

// bodyError returns the HTTP error for a body that could not be read whole,
// or nil when r's body was read without hitting a limit.
func bodyError(r *http.Request) error {
	b, ok := r.Body.(*boundedBody)
	switch {
	case !ok:
		return nil
	case b.tooLarge:
		return bodyTooLarge(b.limit)
	case b.timedOut:
		return &runtime.HTTPStatusError{HTTPStatus: http.StatusRequestTimeout,
			Err: status.Error(codes.DeadlineExceeded, "request body not received within the server's read timeout")}
	}
	return nil
}

func bodyTooLarge(limit int64) error {
	st, err := status.New(codes.InvalidArgument, fmt.Sprintf("request body exceeds %d bytes", limit)).
		WithDetails(&errdetails.ErrorInfo{Reason: ReasonBodyTooLarge, Domain: apierror.Domain,
			Metadata: map[string]string{"max_bytes": fmt.Sprint(limit)}})
	if err != nil {
		st = status.New(codes.InvalidArgument, fmt.Sprintf("request body exceeds %d bytes", limit))
	}
	return &runtime.HTTPStatusError{HTTPStatus: http.StatusRequestEntityTooLarge, Err: st.Err()}
}

// gatewayReplyMargin: see boundHTTP.
const gatewayReplyMargin = time.Second

// boundHTTP caps every HTTP request's body at the configured size and its
// handling at the request timeout (the gateway passes that deadline on to
// the gRPC handler, with a reply margin). A body declared too large is refused before any of it
// is read.
func (s *Server) boundHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > s.cfg.MaxBodyBytes {
			_, out := runtime.MarshalerForRequest(s.mux, r)
			GatewayErrorHandler(r.Context(), s.mux, out, w, r, bodyTooLarge(s.cfg.MaxBodyBytes))
			return
		}
		// The gateway passes this deadline on to the gRPC call, where
		// deadlineUnary caps the handler at RequestTimeout. The margin lets
		// the handler's own answer (503 from a statement that ran out of
		// time on a dead database) reach the gateway before the gateway
		// gives up itself and answers 504 at the same instant.
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout+gatewayReplyMargin)
		defer cancel()
		r = r.WithContext(ctx)
		r.Body = &boundedBody{ReadCloser: http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), limit: s.cfg.MaxBodyBytes}
		next.ServeHTTP(w, r)
	})
}

// logThrottle lets one log line per key through per interval and counts the
// ones it held back, so a condition polled every second (readiness) or hit
// by every request (an outage) is logged, not flooded.
type logThrottle struct {
	every   time.Duration
	mu      sync.Mutex
	last    map[string]time.Time
	skipped map[string]int
}

func newLogThrottle(every time.Duration) *logThrottle {
	return &logThrottle{every: every, last: map[string]time.Time{}, skipped: map[string]int{}}
}

// allow reports whether a line for key may be logged now, and how many were
// held back since the last one.
func (l *logThrottle) allow(key string, now time.Time) (ok bool, skipped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if last, seen := l.last[key]; seen && now.Sub(last) < l.every {
		l.skipped[key]++
		return false, 0
	}
	skipped = l.skipped[key]
	l.last[key], l.skipped[key] = now, 0
	return true, skipped
}

// reset forgets key, so its next line is logged at once (a check that
// recovered and fails again is news).
func (l *logThrottle) reset(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.last, key)
	delete(l.skipped, key)
}
