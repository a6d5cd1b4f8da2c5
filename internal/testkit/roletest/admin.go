package roletest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/lossless-dev/lossless/pkg/waitfor"
)

// Guarded is what AdminRPCsRefuseWithoutToken checks on one service's gRPC
// listener.
type Guarded struct {
	// Addr is the listener's address.
	Addr string
	// Mounted is what the service's gRPC server registered
	// (grpc.Server.GetServiceInfo).
	Mounted map[string]grpc.ServiceInfo
	// Public are the services anyone may call ("lossless.workorder.v1.WorkOrderService");
	// grpc.health.v1.Health is always public. Every other mounted service is
	// an admin service.
	Public []string
	// Open are the admin methods callable without the token
	// ("/lossless.provider.v1.ProviderAdminService/GetFaults").
	Open []string
}

// AdminRPCsRefuseWithoutToken calls every method of every admin service the
// server mounts, as its proto descriptor lists them, with an empty request
// and no token, and fails unless each is refused with UNAUTHENTICATED (or,
// for an Open method, answered without an auth refusal). The methods come
// from the descriptors, not from a list in the service: an RPC or a service
// added later is checked without anyone remembering to, and fails here
// until it is guarded or deliberately opened.
func AdminRPCsRefuseWithoutToken(t *testing.T, g Guarded) {
	t.Helper()
	conn, err := grpc.NewClient(g.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	public := append([]string{healthpb.Health_ServiceDesc.ServiceName}, g.Public...)
	admin := 0
	for name, info := range g.Mounted {
		if slices.Contains(public, name) {
			continue
		}
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			t.Fatalf("mounted service %s has no registered descriptor: %v", name, err)
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok {
			t.Fatalf("%s is not a service", name)
		}
		methods := sd.Methods()
		if methods.Len() != len(info.Methods) {
			t.Fatalf("%s: the descriptor lists %d methods, the server mounts %d", name, methods.Len(), len(info.Methods))
		}
		for i := range methods.Len() {
			m := methods.Get(i)
			full := "/" + name + "/" + string(m.Name())
			in, err := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
			if err != nil {
				t.Fatalf("%s: request type: %v", full, err)
			}
			out, err := protoregistry.GlobalTypes.FindMessageByName(m.Output().FullName())
			if err != nil {
				t.Fatalf("%s: response type: %v", full, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var code codes.Code
			waitfor.Condition(t, 10*time.Second, full+" answers", func() bool {
				err := conn.Invoke(ctx, full, in.New().Interface(), out.New().Interface())
				code = status.Code(err)
				return code != codes.Unavailable
			})
			cancel()
			if slices.Contains(g.Open, full) {
				if code == codes.Unauthenticated || code == codes.PermissionDenied || code == codes.Unimplemented {
					t.Errorf("%s is open but answered %v without a token", full, code)
				}
			} else if code != codes.Unauthenticated {
				t.Errorf("%s without a token: %v, want UNAUTHENTICATED (guard it, or open it deliberately)", full, code)
			}
			admin++
		}
	}
	if admin == 0 {
		t.Fatalf("no admin method mounted among %v", keys(g.Mounted))
	}
	t.Logf("%d admin methods checked", admin)
}

func keys(m map[string]grpc.ServiceInfo) string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
