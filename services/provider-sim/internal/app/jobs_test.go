package app_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	providerv1 "github.com/lossless-dev/lossless/gen/lossless/provider/v1"
	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// Jobs accepted through SubmitWorkOrder and run by the real engine under
// the duplicate and poison faults come back through ListJobs and GetJob as
// the engine left them: the duplicate's two copies and the poison message
// recorded and published, filtered, paged newest first, refused when
// invalid or without the operator token.
func TestJobsAreListedAndFetchedWithTheirMessages(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Millisecond)
	ctx := operatorContext(operatorToken)
	admin := providerv1.NewProviderAdminServiceClient(b.admin)
	intake := providerv1.NewProviderServiceClient(b.conn)
	submit := func(f *providerv1.Faults) string {
		t.Helper()
		// The plan is drawn at acceptance: the knobs in force now are this
		// job's.
		if _, err := admin.UpdateFaults(ctx, &providerv1.UpdateFaultsRequest{Faults: f, Authorization: opAuth}); err != nil {
			t.Fatal(err)
		}
		id := uuid.NewString()
		if _, err := intake.SubmitWorkOrder(context.Background(), &providerv1.SubmitWorkOrderRequest{
			WorkOrderId: id, CustomerId: "c-1", Description: "paint", Positions: 2}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	dup := submit(&providerv1.Faults{Duplicate: 1, Seed: 1})
	poison := submit(&providerv1.Faults{Poison: 1, Seed: 1})
	plain := []string{submit(&providerv1.Faults{Seed: 1}), submit(&providerv1.Faults{Seed: 1})}
	waitfor.Value(t, 30*time.Second, "all four jobs DONE", 4, func() int {
		resp, err := admin.ListJobs(ctx, &providerv1.ListJobsRequest{State: "DONE"})
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.GetJobs())
	})

	jobOf := func(order string) *providerv1.Job {
		t.Helper()
		resp, err := admin.ListJobs(ctx, &providerv1.ListJobsRequest{WorkOrderId: order})
		if err != nil || len(resp.GetJobs()) != 1 || resp.GetJobs()[0].GetWorkOrderId() != order || resp.GetNextPageToken() != "" {
			t.Fatalf("jobs of %s: %v %v", order, resp, err)
		}
		return resp.GetJobs()[0]
	}
	get := func(order string) *providerv1.GetJobResponse {
		t.Helper()
		resp, err := admin.GetJob(ctx, &providerv1.GetJobRequest{JobId: jobOf(order).GetJobId()})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	d := get(dup)
	if j := d.GetJob(); j.GetState() != "DONE" || !j.GetFaults().GetDuplicate() || j.GetFaults().GetPoison() != "" ||
		j.GetLeaseEpoch() < 1 || j.GetLeaseOwner() != "" || j.GetLastError() != "" || j.GetPositions() != 2 ||
		j.GetAcceptTime() == nil || j.GetStartTime() == nil || j.GetCompleteTime() == nil {
		t.Errorf("duplicate job: %v", j)
	}
	if ms := d.GetMessages(); len(ms) != 2 ||
		ms[0].GetKind() != "STARTED" || ms[0].GetCopies() != 1 || ms[0].GetPublishCount() != 1 ||
		ms[1].GetKind() != "COMPLETED" || ms[1].GetCopies() != 2 || ms[1].GetPublishCount() != 2 ||
		ms[1].GetOrderingKey() != dup || ms[1].GetPublishTime() == nil || ms[1].GetEventId() == "" {
		t.Errorf("duplicate job's messages: %v", ms)
	}
	p := get(poison)
	if f := p.GetJob().GetFaults(); f.GetPoison() == "" || f.GetDuplicate() {
		t.Errorf("poison job's faults: %v", f)
	}
	var kinds []string
	for _, m := range p.GetMessages() {
		kinds = append(kinds, m.GetKind())
		if m.GetPublishTime() == nil || m.GetPublishCount() != 1 {
			t.Errorf("poison job's message not published once: %v", m)
		}
	}
	if strings.Join(kinds, ",") != "STARTED,POISON,COMPLETED" {
		t.Errorf("poison job's messages %v, want STARTED, POISON, COMPLETED", kinds)
	}

	// Newest first, page by page, every job exactly once.
	var paged []string
	req := &providerv1.ListJobsRequest{PageSize: 1}
	for page := 0; ; page++ {
		if page > 4 {
			t.Fatal("paging does not end")
		}
		resp, err := admin.ListJobs(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range resp.GetJobs() {
			paged = append(paged, j.GetWorkOrderId())
		}
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	if want := []string{plain[1], plain[0], poison, dup}; strings.Join(paged, ",") != strings.Join(want, ",") {
		t.Errorf("paged %v, want newest first %v", paged, want)
	}
	if resp, err := admin.ListJobs(ctx, &providerv1.ListJobsRequest{WorkOrderId: dup, State: "ACCEPTED"}); err != nil || len(resp.GetJobs()) != 0 {
		t.Errorf("DONE job listed as ACCEPTED: %v %v", resp, err)
	}
	first, err := admin.ListJobs(ctx, &providerv1.ListJobsRequest{PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}

	for name, c := range map[string]struct {
		call  func() error
		field string
	}{
		"work order not a UUID": {func() error {
			_, err := admin.ListJobs(ctx, &providerv1.ListJobsRequest{WorkOrderId: "nope"})
			return err
		}, "work_order_id"},
		"unknown state": {func() error {
			_, err := admin.ListJobs(ctx, &providerv1.ListJobsRequest{State: "PARKED"})
			return err
		}, "state"},
		"page too large": {func() error {
			_, err := admin.ListJobs(ctx, &providerv1.ListJobsRequest{PageSize: 501})
			return err
		}, "page_size"},
		"token of another filter": {func() error {
			_, err := admin.ListJobs(ctx, &providerv1.ListJobsRequest{State: "DONE", PageSize: 1, PageToken: first.GetNextPageToken()})
			return err
		}, "page_token"},
		"malformed token": {func() error {
			_, err := admin.ListJobs(ctx, &providerv1.ListJobsRequest{PageToken: "xyz"})
			return err
		}, "page_token"},
		"job id not a UUID": {func() error {
			_, err := admin.GetJob(ctx, &providerv1.GetJobRequest{JobId: "j-1"})
			return err
		}, "job_id"},
	} {
		err := c.call()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
			continue
		}
		if got := violations(err); len(got) != 1 || got[0] != c.field {
			t.Errorf("%s: violations %v, want [%s]", name, got, c.field)
		}
	}
	if _, err := admin.GetJob(ctx, &providerv1.GetJobRequest{JobId: uuid.NewString()}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown job: %v, want NOT_FOUND", err)
	}

	for name, call := range map[string]func(context.Context) error{
		"ListJobs": func(c context.Context) error { _, err := admin.ListJobs(c, &providerv1.ListJobsRequest{}); return err },
		"GetJob": func(c context.Context) error {
			_, err := admin.GetJob(c, &providerv1.GetJobRequest{JobId: d.GetJob().GetJobId()})
			return err
		},
	} {
		if err := call(context.Background()); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s without a token: %v, want UNAUTHENTICATED", name, err)
		}
		if err := call(operatorContext("not-the-operator-token-0123456789")); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s with a wrong token: %v, want PERMISSION_DENIED", name, err)
		}
	}
	path := "/v1/jobs/" + d.GetJob().GetJobId()
	if r := b.adminHTTP(t, http.MethodGet, path, "", ""); r.status != http.StatusUnauthorized {
		t.Errorf("GET %s without a token: HTTP %d, want 401", path, r.status)
	}
	if r := b.adminHTTP(t, http.MethodGet, path, "", "Bearer "+operatorToken); r.status != http.StatusOK ||
		!strings.Contains(r.body, `"publishCount":2`) {
		t.Errorf("GET %s: HTTP %d %s, want the job with its duplicated completion", path, r.status, r.body)
	}
}

func violations(err error) []string {
	var out []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField())
			}
		}
	}
	return out
}
