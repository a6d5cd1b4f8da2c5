package roletest

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// AdminServicesNotOnThePublicListener fails unless the public gRPC
// listener at publicAddr mounts none of the admin services (admin: what the
// admin server registered) and answers a call of each of their methods
// UNIMPLEMENTED, whatever token the caller has or lacks.
func AdminServicesNotOnThePublicListener(t *testing.T, publicAddr string, public, admin map[string]grpc.ServiceInfo) {
	t.Helper()
	if len(admin) == 0 {
		t.Fatal("no admin service mounted")
	}
	conn, err := grpc.NewClient(publicAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	for name, info := range admin {
		if _, ok := public[name]; ok {
			t.Errorf("%s is mounted on the public listener", name)
		}
		for _, m := range info.Methods {
			full := "/" + name + "/" + m.Name
			var code codes.Code
			waitfor.Condition(t, 10*time.Second, full+" answers", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				// The server never decodes the request of a method it
				// does not serve: any message will do.
				code = status.Code(conn.Invoke(ctx, full, &emptypb.Empty{}, &emptypb.Empty{}))
				return code != codes.Unavailable
			})
			if code != codes.Unimplemented {
				t.Errorf("%s on the public listener: %v, want UNIMPLEMENTED", full, code)
			}
		}
	}
}
