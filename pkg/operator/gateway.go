// The gateway mark: how a guard tells the process's own REST gateway from
// any other caller, whose x-forwarded-for it must not believe.

package operator

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/metadata"
)

// gatewayMarkKey is the metadata the gateway adds to every call it relays.
const gatewayMarkKey = "x-lossless-gateway-mark"

// GatewayMark is a per-process secret the REST gateway adds to the calls it
// relays (ServeMuxOption), so that guards (WithGatewayMark) believe their
// x-forwarded-for. It never leaves the process: the gateway calls its own
// gRPC listener.
type GatewayMark struct{ secret string }

// NewGatewayMark returns a fresh random mark.
func NewGatewayMark() (*GatewayMark, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	return &GatewayMark{secret: hex.EncodeToString(b)}, nil
}

// ServeMuxOption makes the gateway send the mark (server.WithGatewayOptions).
func (m *GatewayMark) ServeMuxOption() runtime.ServeMuxOption {
	return runtime.WithMetadata(func(context.Context, *http.Request) metadata.MD {
		return metadata.Pairs(gatewayMarkKey, m.secret)
	})
}

// relayed reports whether md carries the mark; a nil mark matches nothing.
func (m *GatewayMark) relayed(md metadata.MD) bool {
	if m == nil {
		return false
	}
	for _, v := range md.Get(gatewayMarkKey) {
		if subtle.ConstantTimeCompare([]byte(v), []byte(m.secret)) == 1 {
			return true
		}
	}
	return false
}

// WithGatewayMark makes the guard key the calls of the process's REST
// gateway by their HTTP client's address (x-forwarded-for).
func WithGatewayMark(m *GatewayMark) GuardOption {
	return func(o *guardOptions) { o.gateway = m }
}
