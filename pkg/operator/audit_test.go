package operator_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lossless-dev/lossless/pkg/operator"
)

// AuthorizationViolations names each bad field under the prefix, trimmed
// values counted in characters; ValidateAuthorization says the same as one
// error.
func TestAuthorizationViolationsNameEachField(t *testing.T) {
	for _, c := range []struct {
		ticket, actor string
		want          string
	}{
		{"INC-1", "alice", ""},
		{strings.Repeat("é", operator.MaxAuditLength), " alice ", ""},
		{"", "alice", "authorization.ticket is required"},
		{" \t", "", "authorization.ticket is required; authorization.actor is required"},
		{strings.Repeat("x", operator.MaxAuditLength+1), "alice", "authorization.ticket must be at most 200 characters"},
		{"INC-1", "al\x00ice", "authorization.actor contains a NUL byte"},
	} {
		var got []string
		for _, v := range operator.AuthorizationViolations("authorization.", c.ticket, c.actor) {
			got = append(got, v.Field+" "+v.Description)
		}
		if joined := strings.Join(got, "; "); (c.want == "") != (joined == "") || !strings.HasPrefix(joined, c.want) {
			t.Errorf("%q, %q: %q, want %q", c.ticket, c.actor, joined, c.want)
		}
		err := operator.ValidateAuthorization(c.ticket, c.actor)
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(fmt.Sprint(err), strings.TrimPrefix(strings.Split(c.want, ";")[0], "authorization."))) {
			t.Errorf("ValidateAuthorization(%q, %q) = %v, want %q", c.ticket, c.actor, err, c.want)
		}
	}
}
