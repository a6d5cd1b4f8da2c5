package admin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/lossless-dev/lossless/gen/lossless/events/v1"
	moneyv1 "github.com/lossless-dev/lossless/gen/lossless/money/v1"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/migrations"
	"github.com/lossless-dev/lossless/pkg/leasequeue"
	opsv1 "github.com/lossless-dev/lossless/pkg/operator/opsv1"
	"github.com/lossless-dev/lossless/pkg/pgtest"
	"github.com/lossless-dev/lossless/pkg/pubsub"
	"github.com/lossless-dev/lossless/pkg/retry"
	"github.com/lossless-dev/lossless/pkg/server"
	"github.com/lossless-dev/lossless/services/billing/internal/intake"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const token = "s3cret-billing-operator-token-32c"

func completion(order string) *eventsv1.WorkOrderCompletionRecorded {
	return &eventsv1.WorkOrderCompletionRecorded{
		EventId: uuid.NewString(), WorkOrderId: order, CustomerId: "cust-7",
		Description: "install 3 panels", Positions: 3, CompletedItems: 3,
		UnitPrice:   &moneyv1.Money{CurrencyCode: "EUR", MinorUnits: 12_50},
		CompletedAt: timestamppb.New(time.Date(2026, 4, 1, 8, 0, 0, 0, time.UTC)),
	}
}

func message(t *testing.T, n int, ev *eventsv1.WorkOrderCompletionRecorded) *pubsub.Received {
	t.Helper()
	data, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return &pubsub.Received{ID: fmt.Sprint("m", n), Data: data,
		Attributes: pubsub.EventAttributes(ev.GetEventId(), intake.EventType, 1, time.Now())}
}

func fieldViolations(err error) []string {
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

// Jobs and parked messages made by billing's own intake and queue come back
// through OperatorService as the worker left them (an invoice job's unique
// key is its work order id): filtered, paged, refused
// when invalid or unauthenticated.
func TestOperatorService_ListsJobsAndParkedMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)
	pool := pgtest.NewPool(t, migrations.Billing()...)
	queue, err := leasequeue.New(pool, leasequeue.Config{Name: "invoices"}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := intake.New(pool, queue, intake.Config{JobMaxAttempts: 3}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	orders := []string{uuid.NewString(), uuid.NewString(), uuid.NewString()}
	noPrice := completion(uuid.NewString())
	noPrice.UnitPrice = nil
	batch := []*pubsub.Received{message(t, 1, completion(orders[0])), message(t, 2, completion(orders[1])),
		message(t, 3, completion(orders[2])), message(t, 4, noPrice),
		{ID: "m5", Data: []byte("\xff not a proto"), Attributes: pubsub.EventAttributes("e-5", intake.EventType, 1, time.Now())}}
	for i, err := range in.HandleBatch(ctx, batch) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	// The first job fails for good (dead), the second is running.
	claimed, err := queue.Claim(ctx, "worker-1", 1, 0)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if err := queue.Fail(ctx, claimed[0], retry.Permanent(errors.New("customer unknown"))); err != nil {
		t.Fatal(err)
	}
	running, err := queue.Claim(ctx, "worker-2", 1, claimed[0].ID)
	if err != nil || len(running) != 1 {
		t.Fatalf("second claim: %v %v", running, err)
	}

	ocl, octx := repair{pool: pool, queue: queue, in: in}.operatorService(t, nil)
	cl := ocl

	jobs, err := cl.ListJobs(octx, &opsv1.ListJobsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	js := jobs.GetJobs()
	if len(js) != 3 || jobs.GetNextPageToken() != "" {
		t.Fatalf("jobs: %v", js)
	}
	// Newest first.
	if js[0].GetUniqueKey() != orders[2] || js[0].GetState() != "available" || js[0].GetAttempts() != 0 || js[0].GetMaxAttempts() != 3 {
		t.Errorf("available job: %v", js[0])
	}
	if j := js[1]; j.GetUniqueKey() != orders[1] || j.GetState() != "running" || j.GetLeaseOwner() == "" ||
		j.GetEpoch() != 1 || j.GetAttempts() != 1 || !j.GetDueTime().AsTime().After(time.Now()) {
		t.Errorf("running job: %v", j)
	}
	if j := js[2]; j.GetUniqueKey() != orders[0] || j.GetState() != "dead" || j.GetLastError() == "" || j.GetFinishTime() == nil {
		t.Errorf("dead job: %v", j)
	}
	dead, err := cl.ListJobs(octx, &opsv1.ListJobsRequest{State: "dead"})
	if err != nil || len(dead.GetJobs()) != 1 || dead.GetJobs()[0].GetUniqueKey() != orders[0] {
		t.Fatalf("dead jobs: %v %v", dead, err)
	}
	// By work order: its one job, or none in another state.
	ofOrder, err := cl.ListJobs(octx, &opsv1.ListJobsRequest{UniqueKey: orders[1]})
	if err != nil || len(ofOrder.GetJobs()) != 1 || ofOrder.GetJobs()[0].GetState() != "running" ||
		ofOrder.GetJobs()[0].GetEpoch() != 1 || ofOrder.GetNextPageToken() != "" {
		t.Fatalf("job of order %s: %v %v, want its running job", orders[1], ofOrder, err)
	}
	if none, err := cl.ListJobs(octx, &opsv1.ListJobsRequest{UniqueKey: orders[1], State: "dead"}); err != nil || len(none.GetJobs()) != 0 {
		t.Fatalf("dead job of order %s: %v %v, want none", orders[1], none, err)
	}
	var paged []string
	req := &opsv1.ListJobsRequest{PageSize: 2}
	for page := 0; ; page++ {
		if page > 2 {
			t.Fatal("paging does not end")
		}
		resp, err := cl.ListJobs(octx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range resp.GetJobs() {
			paged = append(paged, j.GetUniqueKey())
		}
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	if len(paged) != 3 || paged[0] != orders[2] || paged[2] != orders[0] {
		t.Errorf("paged jobs: %v", paged)
	}

	msgs, err := ocl.ListParkedMessages(octx, &opsv1.ListParkedMessagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ms := msgs.GetMessages(); len(ms) != 2 || ms[0].GetMessageId() != "m4" || ms[0].GetSubject() != noPrice.GetWorkOrderId() ||
		ms[0].GetReason() == "" || ms[0].GetSubscription() != topology.SubWorkOrderEvents || ms[0].GetParkTime() == nil ||
		ms[0].GetEventId() != noPrice.GetEventId() || ms[1].GetMessageId() != "m5" {
		t.Fatalf("parked: %v", ms)
	}
	byOrder, err := ocl.ListParkedMessages(octx, &opsv1.ListParkedMessagesRequest{Subject: noPrice.GetWorkOrderId()})
	if err != nil || len(byOrder.GetMessages()) != 1 || byOrder.GetMessages()[0].GetMessageId() != "m4" {
		t.Fatalf("parked by order: %v %v", byOrder, err)
	}
	first, err := ocl.ListParkedMessages(octx, &opsv1.ListParkedMessagesRequest{PageSize: 1})
	if err != nil || len(first.GetMessages()) != 1 || first.GetNextPageToken() == "" {
		t.Fatalf("parked page 1: %v %v", first, err)
	}
	second, err := ocl.ListParkedMessages(octx, &opsv1.ListParkedMessagesRequest{PageSize: 1, PageToken: first.GetNextPageToken()})
	if err != nil || len(second.GetMessages()) != 1 || second.GetMessages()[0].GetMessageId() != "m5" || second.GetNextPageToken() != "" {
		t.Fatalf("parked page 2: %v %v", second, err)
	}

	for name, c := range map[string]struct {
		call  func() error
		field string
	}{
		"unknown state": {func() error {
			_, err := cl.ListJobs(octx, &opsv1.ListJobsRequest{State: "parked"})
			return err
		}, "state"},
		"jobs page too large": {func() error {
			_, err := cl.ListJobs(octx, &opsv1.ListJobsRequest{PageSize: 501})
			return err
		}, "page_size"},
		"jobs token of another state": {func() error {
			_, err := cl.ListJobs(octx, &opsv1.ListJobsRequest{State: "dead", PageToken: jobsToken(t, cl, octx)})
			return err
		}, "page_token"},
		"NUL in unique key": {func() error {
			_, err := cl.ListJobs(octx, &opsv1.ListJobsRequest{UniqueKey: "a\x00"})
			return err
		}, "unique_key"},
		"jobs token of another order": {func() error {
			_, err := cl.ListJobs(octx, &opsv1.ListJobsRequest{UniqueKey: orders[0], PageToken: jobsToken(t, cl, octx)})
			return err
		}, "page_token"},
		"NUL in order": {func() error {
			_, err := ocl.ListParkedMessages(octx, &opsv1.ListParkedMessagesRequest{Subject: "\x00"})
			return err
		}, "subject"},
		"parked token of another order": {func() error {
			_, err := ocl.ListParkedMessages(octx, &opsv1.ListParkedMessagesRequest{Subject: orders[0], PageToken: first.GetNextPageToken()})
			return err
		}, "page_token"},
		"malformed token": {func() error {
			_, err := ocl.ListParkedMessages(octx, &opsv1.ListParkedMessagesRequest{PageToken: "xyz"})
			return err
		}, "page_token"},
	} {
		err := c.call()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
			continue
		}
		if got := fieldViolations(err); len(got) != 1 || got[0] != c.field {
			t.Errorf("%s: violations %v, want [%s]", name, got, c.field)
		}
	}

	if _, err := cl.ListJobs(ctx, &opsv1.ListJobsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("jobs without a token: %v", err)
	}
	if _, err := ocl.ListParkedMessages(ctx, &opsv1.ListParkedMessagesRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("parked without a token: %v", err)
	}
	wrong := metadata.NewOutgoingContext(ctx, metadata.Pairs("authorization", "Bearer guess"))
	if _, err := cl.ListJobs(wrong, &opsv1.ListJobsRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("jobs with a wrong token: %v", err)
	}
}

// jobsToken is a next-page token of the unfiltered job listing.
func jobsToken(t *testing.T, cl opsv1.OperatorServiceClient, ctx context.Context) string {
	t.Helper()
	resp, err := cl.ListJobs(ctx, &opsv1.ListJobsRequest{PageSize: 1})
	if err != nil || resp.GetNextPageToken() == "" {
		t.Fatalf("token: %v %v", resp, err)
	}
	return resp.GetNextPageToken()
}

// serveGRPC serves what register registers as production does (pkg/server:
// auth first, then request validation) and returns a connection to it.
func serveGRPC(t *testing.T, auth grpc.UnaryServerInterceptor, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler),
		server.WithAuthInterceptors(auth))
	if err != nil {
		t.Fatal(err)
	}
	register(srv.GRPC())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server shutdown: %v", err)
		}
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
