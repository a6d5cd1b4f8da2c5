package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/devtools/localstack"
)

// callerHTTP is an HTTP client calling the stack's work-order API as its
// demo client: every request carries an ID token of the stack's local
// issuer (docs/adr/0017-caller-identity.md).
func callerHTTP(tb testing.TB, stack *localstack.Stack, timeout time.Duration) *http.Client {
	tb.Helper()
	hc, err := stack.CallerHTTPClient(&http.Client{Timeout: timeout})
	if err != nil {
		tb.Fatal(err)
	}
	return hc
}
