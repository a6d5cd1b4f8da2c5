// The operator command line (pkg/operator RunCLI) on billing's real schema,
// with the fixture of operator_service_test.go.
package migrations_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lossless-dev/lossless/pkg/operator"
)

// cli runs one operator command in process over f (a service with a token
// the command line does not hold), for consumer demo.
func (f fixture) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := operator.RunCLI(context.Background(), args, loggedIn(t, f.inProcess(t), args, "frank"), "demo", &out)
	return out.String(), err
}

// loggedIn is ops run by the operator the command names with --actor (the
// test stands in for the command line's login, operator.ActingAs), or by
// def.
func loggedIn(t *testing.T, ops operator.Operations, args []string, def string) operator.Operations {
	t.Helper()
	as := def
	for i, a := range args {
		if (a == "--actor" || a == "-actor") && i+1 < len(args) && args[i+1] != "" {
			as = args[i+1]
		}
	}
	ops, err := operator.ActingAs(ops, as)
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

// The service's own command line runs inside the trust boundary: without
// the operator token, which the same service refuses to a caller outside.
func TestRunCLI_InProcessNeedsNoTokenTheServiceStillDoes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var out bytes.Buffer
	if err := operator.RunCLI(context.Background(), []string{"audit", "list"}, f.service(t, opsToken), "demo", &out); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the service called without the token: %v, want UNAUTHENTICATED", err)
	}
	if out, err := f.cli(t, "outbox", "list", "--states", "FAILED,PUBLISHED"); err != nil || strings.Count(out, "\n") != 2 {
		t.Fatalf("in process: %q %v, want both events", out, err)
	}
	for _, args := range [][]string{nil, {"outbox"}, {"outbox", "purge"}, {"queue", "list"}, {"outbox", "list", "--limit", "501"},
		{"outbox", "requeue", "--ticket", "INC-21", "--actor", "frank"}, {"parked", "replay", "--ticket", "INC-21", "--actor", "frank"},
		{"audit", "list", "--no-such-flag"}} {
		if _, err := f.cli(t, args...); !errors.Is(err, operator.ErrUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	if out, _ := f.cli(t, "outbox", "purge"); !strings.Contains(out, "outbox requeue") {
		t.Errorf("usage not printed: %q", out)
	}
	f.unchanged(t, "after malformed commands")
}

// `<service> outbox list|requeue` and `audit list`: the list prints the
// FAILED event as a JSON line; an incomplete requeue is refused and changes
// nothing; the dry run names the FAILED event, reports the published one
// and changes nothing but its audit row; the requeue makes the event
// PENDING with a fresh budget; both are audited and listed newest first.
func TestRunCLI_OutboxRequeue_DryRunThenOnceAudited(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	out, err := f.cli(t, "outbox", "list", "--states", "failed")
	if err != nil || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"event_id":"`+f.failed+`"`) ||
		!strings.Contains(out, `"state":"FAILED"`) || !strings.Contains(out, `"last_error":"permanent: downstream refuses the message"`) {
		t.Fatalf("outbox list: %q %v", out, err)
	}
	if out, err = f.cli(t, "outbox", "list", "--states", "PUBLISHED,FAILED", "--limit", "1"); err != nil || !strings.Contains(out, `{"next_page_token":"`) {
		t.Fatalf("first page: %q %v, want a next page token", out, err)
	}
	for name, args := range map[string][]string{
		"no ticket":  {"outbox", "requeue", "--actor", "frank", "--ids", f.failed},
		"no actor":   {"outbox", "requeue", "--ticket", "INC-21", "--ids", f.failed},
		"not a uuid": {"outbox", "requeue", "--ticket", "INC-21", "--actor", "frank", "--ids", "42"},
	} {
		if _, err := f.cli(t, args...); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
		}
	}
	f.unchanged(t, "after invalid requeues")

	out, err = f.cli(t, "outbox", "requeue", "--ticket", "INC-21", "--actor", "frank", "--ids", f.failed+","+f.published, "--dry-run")
	if err != nil || !strings.Contains(out, "dry run: would requeue 1 FAILED outbox events: ["+f.failed+"]") ||
		!strings.Contains(out, "not requeued: "+f.published+" (PUBLISHED)") {
		t.Fatalf("dry run: %q %v", out, err)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox_events WHERE event_id = $1 AND status = 'FAILED' AND attempts = 1`, f.failed); n != 1 {
		t.Fatal("the dry run changed the event")
	}
	if out, err = f.cli(t, "outbox", "requeue", "-ticket", "INC-21", "-actor", "frank", "-ids", f.failed); err != nil ||
		!strings.Contains(out, "requeued 1 FAILED outbox events: ["+f.failed+"]") {
		t.Fatalf("requeue: %q %v", out, err)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox_events WHERE event_id = $1 AND status = 'PENDING' AND attempts = 0
		AND last_error LIKE 'requeued by frank, ticket INC-21; was: %'`, f.failed); n != 1 {
		t.Fatal("the requeued event is not PENDING with a fresh budget")
	}
	if n := f.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'outbox.requeue' AND ticket = 'INC-21' AND actor = 'frank'
		AND affected = 1 AND params->'requeued' ? $1`, f.failed); n != 2 {
		t.Fatalf("audit rows = %d, want the dry run's and the requeue's", n)
	}
	out, err = f.cli(t, "audit", "list", "--action", "outbox.requeue")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err != nil || len(lines) != 2 || strings.Contains(lines[0], `"dry_run":true`) || !strings.Contains(lines[1], `"dry_run":true`) ||
		!strings.Contains(lines[0], `"actor":"frank"`) {
		t.Fatalf("audit list, newest first: %q %v", out, err)
	}
}

// `<service> parked list|replay`: the open message listed as a JSON line
// (by subject, and after an id: none); the replay refused while the cause
// persists (nothing changed or audited); the dry run reports the outcome
// and leaves the row open; the replay closes it once, by the actor under
// the ticket; both audited as demo.replay-parked.
func TestRunCLI_ParkedReplay_DryRunThenOnceAudited(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := fmt.Sprint(f.parkedID)
	out, err := f.cli(t, "parked", "list")
	if err != nil || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"id":"`+id+`"`) ||
		!strings.Contains(out, `"subscription":"`+demoSub+`"`) || !strings.Contains(out, `"reason":"unknown order"`) {
		t.Fatalf("parked list: %q %v", out, err)
	}
	for _, args := range [][]string{{"--subject", "another-order"}, {"--work-order", "another-order"}, {"--after-id", id}} {
		if out, err := f.cli(t, append([]string{"parked", "list"}, args...)...); err != nil || out != "" {
			t.Fatalf("parked list %v: %q %v, want nothing", args, out, err)
		}
	}
	*f.refuse = true
	if _, err := f.cli(t, "parked", "replay", "--id", id, "--ticket", "INC-21", "--actor", "frank"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("replay while the cause persists: %v, want FAILED_PRECONDITION", err)
	}
	f.unchanged(t, "after a refused replay")

	*f.refuse = false
	if out, err = f.cli(t, "parked", "replay", "--id", id, "--ticket", "INC-21", "--actor", "frank", "--dry-run"); err != nil ||
		out != "dry run: would replay parked message "+id+": applied\n" {
		t.Fatalf("dry run: %q %v", out, err)
	}
	if n := f.count(t, `SELECT count(*) FROM parked_messages WHERE replayed_at IS NULL`); n != 1 {
		t.Fatal("the dry run closed the parked message")
	}
	if out, err = f.cli(t, "parked", "replay", "-id", id, "-ticket", "INC-21", "-actor", "frank"); err != nil ||
		out != "replayed parked message "+id+": applied\n" {
		t.Fatalf("replay: %q %v", out, err)
	}
	if _, err := f.cli(t, "parked", "replay", "--id", id, "--ticket", "INC-21", "--actor", "frank"); status.Code(err) != codes.NotFound {
		t.Fatalf("second replay: %v, want NOT_FOUND", err)
	}
	if n := f.count(t, `SELECT count(*) FROM parked_messages WHERE id = $1 AND replayed_by = 'frank' AND ticket = 'INC-21'`, f.parkedID); n != 1 {
		t.Fatal("the parked message is not closed by the actor under the ticket")
	}
	if n := f.count(t, `SELECT count(*) FROM operator_audit WHERE action = 'demo.replay-parked' AND ticket = 'INC-21' AND actor = 'frank'
		AND affected = 1 AND (params->>'parked_id')::bigint = $1`, f.parkedID); n != 2 {
		t.Fatalf("audit rows = %d, want the dry run's and the replay's", n)
	}
	// The demo consumer has no dead letters: refused, not audited.
	if _, err := f.cli(t, "dead-letters", "replay", "--max", "1", "--ticket", "INC-21", "--actor", "frank"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("dead-letter replay of a consumer without dead letters: %v, want INVALID_ARGUMENT", err)
	}
	if n := f.count(t, `SELECT count(*) FROM operator_audit`); n != 2 {
		t.Fatalf("audit rows = %d after a refused dead-letter replay, want 2", n)
	}
}
