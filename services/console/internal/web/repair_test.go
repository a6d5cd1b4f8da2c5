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

	billingv1 "github.com/lossless-dev/lossless/gen/lossless/billing/v1"
	"github.com/lossless-dev/lossless/pkg/operatorauth"
	"github.com/lossless-dev/lossless/services/console/internal/web"
)

// billingAdmin stands in for billing's BillingAdminService: dead jobs that
// a retry makes available, an audit row per retry (dry runs too), the
// operator token checked by the same guard as the real service.
type billingAdmin struct {
	billingv1.UnimplementedBillingAdminServiceServer
	guard *operatorauth.Guard
	mu    sync.Mutex
	state map[int64]string
	audit []*billingv1.OperatorAuditRecord
}

func (b *billingAdmin) ListInvoiceJobs(ctx context.Context, req *billingv1.ListInvoiceJobsRequest) (*billingv1.ListInvoiceJobsResponse, error) {
	if err := b.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	resp := &billingv1.ListInvoiceJobsResponse{}
	for id, st := range b.state {
		if req.GetState() == "" || st == req.GetState() {
			resp.Jobs = append(resp.Jobs, &billingv1.InvoiceJob{Id: id, State: st, WorkOrderId: "8a3c4c8e-1f0b-4a8e-9d7e-2b8b7f0a1c11"})
		}
	}
	slices.SortFunc(resp.Jobs, func(x, y *billingv1.InvoiceJob) int { return int(y.GetId() - x.GetId()) })
	return resp, nil
}

func (b *billingAdmin) RetryInvoiceJobs(ctx context.Context, req *billingv1.RetryInvoiceJobsRequest) (*billingv1.RetryInvoiceJobsResponse, error) {
	if err := b.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	resp := &billingv1.RetryInvoiceJobsResponse{DryRun: req.GetDryRun()}
	for _, id := range req.GetIds() {
		if b.state[id] == "dead" {
			resp.Ids = append(resp.Ids, id)
			if !req.GetDryRun() {
				b.state[id] = "available"
			}
		}
	}
	params, _ := structpb.NewStruct(map[string]any{"requested": len(req.GetIds())})
	b.audit = append([]*billingv1.OperatorAuditRecord{{Id: int64(len(b.audit) + 1), Action: "jobs.retry", Ticket: req.GetAuthorization().GetTicket(),
		Actor: req.GetAuthorization().GetActor(), DryRun: req.GetDryRun(), Affected: int32(len(resp.Ids)), Params: params}}, b.audit...)
	return resp, nil
}

func (b *billingAdmin) ListOperatorAudit(ctx context.Context, req *billingv1.ListOperatorAuditRequest) (*billingv1.ListOperatorAuditResponse, error) {
	if err := b.guard.Authorize(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	resp := &billingv1.ListOperatorAuditResponse{}
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

func billingBackend(t *testing.T) (*billingAdmin, func(*grpc.Server)) {
	t.Helper()
	guard, err := operatorauth.New(token, "TEST_TOKEN", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	b := &billingAdmin{guard: guard, state: map[int64]string{7: "dead", 8: "dead", 9: "done"}}
	return b, func(s *grpc.Server) { billingv1.RegisterBillingAdminServiceServer(s, b) }
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
	assertNoToken(t, br)
}
