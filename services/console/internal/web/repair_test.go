package web_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/lossless-dev/lossless/pkg/operator"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/services/console/internal/web"
)

// billingAdmin stands in for billing's repair state: dead jobs that a
// retry makes available, an audit row per retry (dry runs too), the
// operator token checked by the same guard as the real service.
type billingAdmin struct {
	guard *operator.Guard
	mu    sync.Mutex
	state map[int64]string
	audit []*opsv1.OperatorAuditRecord
	// outbox stands in for billing's outbox (InvoiceIssued).
	outbox *fakeOutbox
}

func (b billingOps) ListJobs(ctx context.Context, req *opsv1.ListJobsRequest) (*opsv1.ListJobsResponse, error) {
	if err := b.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	resp := &opsv1.ListJobsResponse{}
	for id, st := range b.state {
		if req.GetState() == "" || st == req.GetState() {
			resp.Jobs = append(resp.Jobs, &opsv1.Job{Id: id, State: st, UniqueKey: "8a3c4c8e-1f0b-4a8e-9d7e-2b8b7f0a1c11"})
		}
	}
	slices.SortFunc(resp.Jobs, func(x, y *opsv1.Job) int { return int(y.GetId() - x.GetId()) })
	return resp, nil
}

func (b billingOps) RetryJobs(ctx context.Context, req *opsv1.RetryJobsRequest) (*opsv1.RetryJobsResponse, error) {
	if err := b.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	resp := &opsv1.RetryJobsResponse{DryRun: req.GetDryRun()}
	for _, id := range req.GetIds() {
		if b.state[id] == "dead" {
			resp.Ids = append(resp.Ids, id)
			if !req.GetDryRun() {
				b.state[id] = "available"
			}
		}
	}
	params, _ := structpb.NewStruct(map[string]any{"requested": len(req.GetIds())})
	b.audit = append([]*opsv1.OperatorAuditRecord{{Id: int64(len(b.audit) + 1), Action: "jobs.retry", Ticket: req.GetAuthorization().GetTicket(),
		Actor: req.GetAuthorization().GetActor(), DryRun: req.GetDryRun(), Affected: int32(len(resp.Ids)), Params: params}}, b.audit...)
	return resp, nil
}

// actors are the audit rows' actors, oldest first.
func (b *billingAdmin) actors() (out []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(b.audit) - 1; i >= 0; i-- {
		out = append(out, b.audit[i].GetActor())
	}
	return out
}

// billingOps stands in for billing's OperatorService over billingAdmin's
// state (its invoice jobs, its outbox, its operator_audit log).
type billingOps struct {
	opsv1.UnimplementedOperatorServiceServer
	*billingAdmin
}

func (b billingOps) ListOperatorAudit(ctx context.Context, req *opsv1.ListOperatorAuditRequest) (*opsv1.ListOperatorAuditResponse, error) {
	if err := b.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	resp := &opsv1.ListOperatorAuditResponse{}
	for _, a := range b.audit {
		if req.GetTicket() == "" || a.GetTicket() == req.GetTicket() {
			resp.Records = append(resp.Records, a)
		}
	}
	return resp, nil
}

func (b *billingAdmin) snapshot() (map[int64]string, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps(b.state), len(b.audit)
}

func maps(m map[int64]string) map[int64]string {
	out := map[int64]string{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func billingBackend(t *testing.T) (*billingAdmin, func(wo, bi *grpc.Server)) {
	t.Helper()
	guard, err := operator.NewGuard(token, "TEST_TOKEN", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	b := &billingAdmin{guard: guard, state: map[int64]string{7: "dead", 8: "dead", 9: "done"},
		outbox: newFakeOutbox(map[string]string{billingFailed: "FAILED"})}
	return b, func(_, bi *grpc.Server) {
		opsv1.RegisterOperatorServiceServer(bi, billingOps{billingAdmin: b})
	}
}

var confirmRE = strings.NewReplacer("\n", " ")

// A retry of dead jobs from the Repair page: refused without CSRF or login
// (nothing retried, nothing audited), refused without ticket or actor; the
// dry run lists the selected dead jobs and changes nothing; its
// confirmation retries exactly those; the Audit page shows both rows under
// the ticket.
func TestRepair_RetryDeadJobs_DryRunThenExactlyWhatItListed(t *testing.T) {
	bill, reg := billingBackend(t)
	_, ts := console(t, web.Config{OperatorToken: token, ReadOpen: true}, reg)
	br := newBrowser(t, ts.URL)
	csrf := br.csrf("/faults")
	form := func(csrf, ticket, mode string, ids ...string) url.Values {
		v := url.Values{"csrf": {csrf}, "ticket": {ticket}, "actor": {"erin"}, "mode": {mode}, "id": ids}
		if csrf == "" {
			v.Del("csrf")
		}
		return v
	}
	if code, _, _ := br.do(http.MethodPost, "/repair/jobs", form(csrf, "INC-3", "real", "7")); code != http.StatusUnauthorized {
		t.Errorf("retry without login: %d, want 401", code)
	}
	br.login(token)
	csrf = br.csrf("/faults")
	if code, _, _ := br.do(http.MethodPost, "/repair/jobs", form("", "INC-3", "real", "7")); code != http.StatusForbidden {
		t.Errorf("retry without CSRF: %d, want 403", code)
	}
	if code, _, _ := br.do(http.MethodPost, "/repair/jobs", form(flip(csrf), "INC-3", "real", "7")); code != http.StatusForbidden {
		t.Errorf("retry with a wrong CSRF token: %d, want 403", code)
	}
	if code, _, _ := br.do(http.MethodPost, "/repair/jobs", form(csrf, "", "dry", "7")); code != http.StatusBadRequest {
		t.Errorf("dry run without a ticket: %d, want 400", code)
	}
	if st, audited := bill.snapshot(); st[7] != "dead" || st[8] != "dead" || audited != 0 {
		t.Fatalf("after refused requests: %v, %d audit rows; want nothing changed", st, audited)
	}

	// The page lists both dead jobs; a dry run of 7 and 9 (done) names 7.
	if _, body, _ := br.do(http.MethodGet, "/repair", nil); !strings.Contains(body, `name="id" value="7"`) || !strings.Contains(body, `name="id" value="8"`) {
		t.Fatal("the Repair page does not list the dead jobs")
	}
	code, body, _ := br.do(http.MethodPost, "/repair/jobs", form(csrf, "INC-3", "dry", "7", "9"))
	if code != http.StatusOK || !strings.Contains(body, "Dry run: 1 dead jobs would be retried") {
		t.Fatalf("dry run: %d %s", code, body)
	}
	if st, audited := bill.snapshot(); st[7] != "dead" || audited != 1 {
		t.Fatalf("after the dry run: %v, %d audit rows; want job 7 dead, the dry run audited", st, audited)
	}
	// The confirmation form carries exactly the dry run's jobs.
	i := strings.Index(body, `action="/repair/jobs"`)
	confirmForm := confirmRE.Replace(body[i : i+strings.Index(body[i:], "</form>")])
	if !strings.Contains(confirmForm, `name="id" value="7"`) || strings.Contains(confirmForm, `value="9"`) || !strings.Contains(confirmForm, `name="mode" value="real"`) {
		t.Fatalf("confirmation form: %s", confirmForm)
	}
	code, body, _ = br.do(http.MethodPost, "/repair/jobs", form(csrf, "INC-3", "real", "7"))
	if code != http.StatusOK || !strings.Contains(body, "Retried 1 jobs") {
		t.Fatalf("retry: %d %s", code, body)
	}
	if st, _ := bill.snapshot(); st[7] != "available" || st[8] != "dead" {
		t.Fatalf("after the retry: %v; want 7 available, 8 still dead", st)
	}
	if code, _, _ := br.do(http.MethodPost, "/repair/jobs", form(csrf, "INC-3", "real")); code != http.StatusBadRequest {
		t.Errorf("a retry without ids: %d, want 400", code)
	}

	_, body, _ = br.do(http.MethodGet, "/audit?service=billing&ticket=INC-3", nil)
	if strings.Count(body, "<td data-audit-ticket>INC-3</td>") != 2 || !strings.Contains(body, "jobs.retry") {
		t.Fatalf("the Audit page does not show the two rows of INC-3: %s", body)
	}
	// The actor is who logged in, not the form's "actor" field.
	if strings.Contains(body, "erin") || strings.Count(body, "<td>alice (shared token)</td>") != 2 {
		t.Fatalf("audit actor: want the session's principal \"alice (shared token)\" on both rows, never the form's: %s", body)
	}
	assertNoToken(t, br)
}

// fakeOutbox stands in for a service's outbox: event states (FAILED,
// PENDING) that a requeue changes, and the audit rows it writes (dry runs
// too), as the services do.
type fakeOutbox struct {
	mu      sync.Mutex
	state   map[string]string
	audited int
}

func newFakeOutbox(state map[string]string) *fakeOutbox { return &fakeOutbox{state: state} }

func (o *fakeOutbox) failed() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ids []string
	for id, st := range o.state {
		if st == "FAILED" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// requeue moves the FAILED ones among ids to PENDING (not on a dry run)
// and returns them and the others.
func (o *fakeOutbox) requeue(ids []string, dry bool) (requeued, skipped []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, id := range ids {
		if o.state[id] != "FAILED" {
			skipped = append(skipped, id)
			continue
		}
		requeued = append(requeued, id)
		if !dry {
			o.state[id] = "PENDING"
		}
	}
	o.audited++
	return requeued, skipped
}

func (o *fakeOutbox) snapshot() (map[string]string, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]string{}
	for k, v := range o.state {
		out[k] = v
	}
	return out, o.audited
}

func (b billingOps) ListOutboxEvents(ctx context.Context, _ *opsv1.ListOutboxEventsRequest) (*opsv1.ListOutboxEventsResponse, error) {
	if err := b.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	resp := &opsv1.ListOutboxEventsResponse{}
	for i, id := range b.outbox.failed() {
		resp.Events = append(resp.Events, &opsv1.OutboxEvent{EventId: id, Sequence: int64(i + 1), State: "FAILED",
			AggregateId: "8a3c4c8e-1f0b-4a8e-9d7e-2b8b7f0a1c11", LastError: "permanent: topic refuses the message"})
	}
	return resp, nil
}

func (b billingOps) RequeueOutboxEvents(ctx context.Context, req *opsv1.RequeueOutboxEventsRequest) (*opsv1.RequeueOutboxEventsResponse, error) {
	if err := b.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	requeued, skipped := b.outbox.requeue(req.GetEventIds(), req.GetDryRun())
	resp := &opsv1.RequeueOutboxEventsResponse{EventIds: requeued, DryRun: req.GetDryRun()}
	for _, id := range skipped {
		resp.Skipped = append(resp.Skipped, &opsv1.SkippedOutboxEvent{EventId: id, State: "PENDING"})
	}
	return resp, nil
}

// workorderOutbox stands in for the workorder service's outbox read and
// requeue (its OperatorService), behind the same operator guard.
type workorderOutbox struct {
	opsv1.UnimplementedOperatorServiceServer
	guard  *operator.Guard
	outbox *fakeOutbox
}

func (w *workorderOutbox) ListOutboxEvents(ctx context.Context, req *opsv1.ListOutboxEventsRequest) (*opsv1.ListOutboxEventsResponse, error) {
	if err := w.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	if !slices.Equal(req.GetStates(), []string{"FAILED"}) {
		return &opsv1.ListOutboxEventsResponse{}, nil
	}
	resp := &opsv1.ListOutboxEventsResponse{}
	for i, id := range w.outbox.failed() {
		resp.Events = append(resp.Events, &opsv1.OutboxEvent{EventId: id, Sequence: int64(i + 1), State: "FAILED",
			AggregateId: "5d0f3f4e-6c1a-4f6e-8a39-0d1c2b3a4f5e", LastError: "permanent: provider refused the order"})
	}
	return resp, nil
}

func (w *workorderOutbox) RequeueOutboxEvents(ctx context.Context, req *opsv1.RequeueOutboxEventsRequest) (*opsv1.RequeueOutboxEventsResponse, error) {
	if err := w.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	requeued, skipped := w.outbox.requeue(req.GetEventIds(), req.GetDryRun())
	resp := &opsv1.RequeueOutboxEventsResponse{EventIds: requeued, DryRun: req.GetDryRun()}
	for _, id := range skipped {
		resp.Skipped = append(resp.Skipped, &opsv1.SkippedOutboxEvent{EventId: id, State: "PENDING"})
	}
	return resp, nil
}

const (
	woFailed1     = "0190a1b2-0000-7000-8000-000000000001"
	woFailed2     = "0190a1b2-0000-7000-8000-000000000002"
	woPending     = "0190a1b2-0000-7000-8000-000000000003"
	billingFailed = "0190a1b2-0000-7000-8000-0000000000b1"
)

// A requeue of FAILED outbox events from the Repair page: refused without
// login or CSRF and without a ticket (nothing requeued, nothing audited);
// the page lists both services' FAILED events; the dry run names the
// selected events that are FAILED and changes nothing; its confirmation
// requeues exactly those, in the service the form names.
func TestRepair_RequeueFailedOutboxEvents_DryRunThenExactlyWhatItListed(t *testing.T) {
	bill, regBilling := billingBackend(t)
	guard, err := operator.NewGuard(token, "TEST_TOKEN", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	wo := &workorderOutbox{guard: guard, outbox: newFakeOutbox(map[string]string{woFailed1: "FAILED", woFailed2: "FAILED", woPending: "PENDING"})}
	_, ts := console(t, web.Config{OperatorToken: token, ReadOpen: true}, regBilling,
		func(s, _ *grpc.Server) { opsv1.RegisterOperatorServiceServer(s, wo) })
	br := newBrowser(t, ts.URL)
	csrf := br.csrf("/faults")
	form := func(csrf, service, ticket, mode string, ids ...string) url.Values {
		v := url.Values{"csrf": {csrf}, "service": {service}, "ticket": {ticket}, "actor": {"erin"}, "mode": {mode}, "event_id": ids}
		if csrf == "" {
			v.Del("csrf")
		}
		return v
	}
	unchanged := func(when string) {
		t.Helper()
		st, audited := wo.outbox.snapshot()
		bst, baudited := bill.outbox.snapshot()
		if st[woFailed1] != "FAILED" || st[woFailed2] != "FAILED" || bst[billingFailed] != "FAILED" || audited+baudited != 0 {
			t.Fatalf("%s: workorder %v, billing %v, %d audit rows; want nothing changed", when, st, bst, audited+baudited)
		}
	}
	if code, _, _ := br.do(http.MethodPost, "/repair/outbox", form(csrf, "workorder", "INC-5", "real", woFailed1)); code != http.StatusUnauthorized {
		t.Errorf("requeue without login: %d, want 401", code)
	}
	br.login(token)
	csrf = br.csrf("/faults")
	if code, _, _ := br.do(http.MethodPost, "/repair/outbox", form("", "workorder", "INC-5", "real", woFailed1)); code != http.StatusForbidden {
		t.Errorf("requeue without CSRF: %d, want 403", code)
	}
	if code, _, _ := br.do(http.MethodPost, "/repair/outbox", form(csrf, "workorder", "", "dry", woFailed1)); code != http.StatusBadRequest {
		t.Errorf("dry run without a ticket: %d, want 400", code)
	}
	if code, _, _ := br.do(http.MethodPost, "/repair/outbox", form(csrf, "workorder", "INC-5", "dry", "not-a-uuid")); code != http.StatusBadRequest {
		t.Errorf("dry run of a malformed id: %d, want 400", code)
	}
	unchanged("after refused requests")

	_, body, _ := br.do(http.MethodGet, "/repair", nil)
	for _, id := range []string{woFailed1, woFailed2, billingFailed} {
		if !strings.Contains(body, `name="event_id" value="`+id+`"`) {
			t.Fatalf("the Repair page does not list FAILED event %s", id)
		}
	}
	if strings.Contains(body, woPending) {
		t.Fatal("the Repair page lists a PENDING event as FAILED")
	}

	// A dry run of a FAILED and a PENDING event names the FAILED one.
	code, body, _ := br.do(http.MethodPost, "/repair/outbox", form(csrf, "workorder", "INC-5", "dry", woFailed1, woPending))
	if code != http.StatusOK || !strings.Contains(body, "Dry run: 1 FAILED workorder outbox events would be requeued; 1 selected are not FAILED") {
		t.Fatalf("dry run: %d %s", code, body)
	}
	if st, audited := wo.outbox.snapshot(); st[woFailed1] != "FAILED" || audited != 1 {
		t.Fatalf("after the dry run: %v, %d audit rows; want the event FAILED, the dry run audited", st, audited)
	}
	i := strings.Index(body, `action="/repair/outbox"`)
	confirmForm := confirmRE.Replace(body[i : i+strings.Index(body[i:], "</form>")])
	if !strings.Contains(confirmForm, `name="event_id" value="`+woFailed1+`"`) || strings.Contains(confirmForm, woPending) ||
		!strings.Contains(confirmForm, `name="service" value="workorder"`) || !strings.Contains(confirmForm, `name="mode" value="real"`) {
		t.Fatalf("confirmation form: %s", confirmForm)
	}
	code, body, _ = br.do(http.MethodPost, "/repair/outbox", form(csrf, "workorder", "INC-5", "real", woFailed1))
	if code != http.StatusOK || !strings.Contains(body, "Requeued 1 workorder outbox events") {
		t.Fatalf("requeue: %d %s", code, body)
	}
	if st, audited := wo.outbox.snapshot(); st[woFailed1] != "PENDING" || st[woFailed2] != "FAILED" || audited != 2 {
		t.Fatalf("after the requeue: %v, %d audit rows; want only the listed event requeued", st, audited)
	}
	if bst, baudited := bill.outbox.snapshot(); bst[billingFailed] != "FAILED" || baudited != 0 {
		t.Fatalf("the workorder requeue touched billing's outbox: %v, %d", bst, baudited)
	}

	// Billing's section goes to billing.
	code, body, _ = br.do(http.MethodPost, "/repair/outbox", form(csrf, "billing", "INC-5", "dry", billingFailed))
	if code != http.StatusOK || !strings.Contains(body, "Dry run: 1 FAILED billing outbox events would be requeued") {
		t.Fatalf("billing dry run: %d %s", code, body)
	}
	if code, _, _ := br.do(http.MethodPost, "/repair/outbox", form(csrf, "billing", "INC-5", "real", billingFailed)); code != http.StatusOK {
		t.Fatalf("billing requeue: %d", code)
	}
	if bst, baudited := bill.outbox.snapshot(); bst[billingFailed] != "PENDING" || baudited != 2 {
		t.Fatalf("billing after the requeue: %v, %d audit rows", bst, baudited)
	}
	assertNoToken(t, br)
}
