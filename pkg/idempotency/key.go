package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/lossless-dev/lossless/pkg/apierror"
)

// MetadataKey is the gRPC metadata key carrying the idempotency key; the HTTP
// gateway forwards the `Idempotency-Key` header under this name.
const MetadataKey = "idempotency-key"

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = 255

// ErrInvalidKey wraps every key validation failure.
var ErrInvalidKey = errors.New("invalid idempotency key")

// ValidateKey accepts 1 to MaxKeyLen visible ASCII characters (0x21–0x7E)
// other than '"' and '\'. UUIDs, ULIDs and base64 tokens all qualify;
// whitespace and control characters do not, because proxies trim or mangle
// them in headers; a quote or backslash would make the bare and the quoted
// header form of one key mean different keys (ParseKey unquotes).
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: must not be empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: byte %d (0x%02x) is not a visible ASCII character", ErrInvalidKey, i, c)
		} else if c == '"' || c == '\\' {
			return fmt.Errorf("%w: byte %d is %q, which is not allowed in a key", ErrInvalidKey, i, c)
		}
	}
	return nil
}

// ParseKey returns the key carried by a header or metadata value. The IETF
// draft defines the header as a Structured Field String, so the draft's own
// example is quoted (`Idempotency-Key: "8e03978e-..."`); most clients send
// the bare token. Both forms name the same key: surrounding quotes are removed
// and escapes resolved. The result is validated with ValidateKey.
func ParseKey(raw string) (string, error) {
	key := strings.TrimSpace(raw)
	if len(key) >= 2 && key[0] == '"' && key[len(key)-1] == '"' {
		unquoted, err := strconv.Unquote(key)
		if err != nil {
			return "", fmt.Errorf("%w: malformed quoted string", ErrInvalidKey)
		}
		key = unquoted
	}
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// KeyFromIncomingContext returns the idempotency key of a gRPC request, with
// ok = false when the client sent none. More than one value, or an invalid
// one, is an ErrInvalidKey error.
func KeyFromIncomingContext(ctx context.Context) (key string, ok bool, err error) {
	vals := metadata.ValueFromIncomingContext(ctx, MetadataKey)
	switch len(vals) {
	case 0:
		return "", false, nil
	case 1:
		key, err := ParseKey(vals[0])
		return key, err == nil, err
	default:
		return "", false, fmt.Errorf("%w: sent %d times, send it once", ErrInvalidKey, len(vals))
	}
}

// StatusError turns the errors of this package into the API's gRPC errors:
// an invalid key is INVALID_ARGUMENT with a field violation on
// "idempotency-key"; ErrMismatch is FAILED_PRECONDITION with reason
// IDEMPOTENCY_KEY_MISMATCH (HTTP 422); ErrInFlight is ABORTED with reason
// IDEMPOTENCY_KEY_IN_FLIGHT (HTTP 409). Other errors are returned unchanged.
func StatusError(err error) error {
	switch {
	case errors.Is(err, ErrInvalidKey):
		return apierror.InvalidArgument(apierror.Violation{Field: MetadataKey, Description: err.Error()})
	case errors.Is(err, ErrMismatch):
		return apierror.FailedPrecondition(apierror.ReasonIdempotencyKeyMismatch,
			"this idempotency key was already used with a different request; use a new key for a new request")
	case errors.Is(err, ErrInFlight):
		return apierror.Aborted(apierror.ReasonIdempotencyKeyInFlight,
			"the first request with this idempotency key is still being processed; retry later")
	}
	return err
}
