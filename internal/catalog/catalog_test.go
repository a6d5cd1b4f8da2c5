package catalog_test

import (
	"os"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/lossless-dev/lossless/internal/catalog"
)

func TestParse_TheRepositoryServicesInStartOrder(t *testing.T) {
	c, err := catalog.Parse(os.DirFS("../../services"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range [][2]string{{"provider-sim", "workorder"}} {
		names := c.Names()
		if i, j := slices.Index(names, want[0]), slices.Index(names, want[1]); i < 0 || j < 0 || i > j {
			t.Errorf("start order %v: want %s before %s", names, want[0], want[1])
		}
	}
}

func decl(name, body string) (string, *fstest.MapFile) {
	return name + "/service.json", &fstest.MapFile{Data: []byte(body)}
}

func fsOf(files ...string) fstest.MapFS {
	m := fstest.MapFS{}
	for i := 0; i+1 < len(files); i += 2 {
		k, v := decl(files[i], files[i+1])
		m[k] = v
	}
	return m
}

const (
	svcA = `{"name":"a","database":"a","grpc_port":9090,"http_port":8080,"publishes":["a-events"]}`
	svcB = `{"name":"b","database":"b","grpc_port":9091,"http_port":8081,"start_after":["a"],"subscribes":["a-events"],
		"local_env":{"A_ADDR":"{grpc:a}","RELAY":"{instance}/{operator_token}"}}`
)

func TestParse_DerivesTopologyOrderAndEnv(t *testing.T) {
	c, err := catalog.Parse(fsOf("b", svcB, "a", svcA))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("order %v, want a before b (b starts after a)", got)
	}
	topo := c.Topology()
	var ids []string
	for _, tp := range topo.Topics {
		ids = append(ids, tp.ID)
	}
	for _, s := range topo.Subscriptions {
		ids = append(ids, s.ID)
	}
	want := []string{"a-events", "b.a-events.dead-letter", "b.a-events", "b.a-events.dead-letter-inspect"}
	if !slices.Equal(ids, want) {
		t.Fatalf("topology ids %v, want %v", ids, want)
	}
	b, _ := c.Service("b")
	env := b.ExpandEnv("b-2", "tok", func(kind, svc string) string { return kind + "://" + svc + "-2:1" })
	if !slices.Equal(env, []string{"A_ADDR=grpc://a-2:1", "RELAY=b-2/tok"}) {
		t.Fatalf("env %v", env)
	}
}

// A service without a database and without gRPC (the console) is declared
// by leaving both out; another service's {http:...} and {grpc:...} reach it.
func TestParse_ServiceWithoutDatabaseOrGRPC(t *testing.T) {
	c, err := catalog.Parse(fsOf("a", svcA, "b", svcB,
		"c", `{"name":"c","http_port":8089,"start_after":["a"],"local_env":{"A":"{grpc:a}","M":"{http:a}/metrics"}}`,
		"d", `{"name":"d","http_port":8088}`))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Service("c")
	if s.Database != "" || s.GRPCPort != 0 {
		t.Fatalf("c = %+v, want no database and no gRPC port", s)
	}
	env := s.ExpandEnv("c-1", "tok", func(kind, svc string) string { return kind + "/" + svc })
	if !slices.Equal(env, []string{"A=grpc/a", "M=http/a/metrics"}) {
		t.Fatalf("env %v", env)
	}
}

// {trace_url} is the run's trace store, asked of addr with no service; a
// service name after it is refused like any unknown placeholder.
func TestParse_TraceURLPlaceholder(t *testing.T) {
	c, err := catalog.Parse(fsOf("a", svcA, "c", `{"name":"c","http_port":8089,"local_env":{"T":"{trace_url}"}}`))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Service("c")
	env := s.ExpandEnv("c-1", "tok", func(kind, svc string) string {
		if kind == "trace_url" && svc == "" {
			return "http://127.0.0.1:4000"
		}
		return "wrong:" + kind + "/" + svc
	})
	if !slices.Equal(env, []string{"T=http://127.0.0.1:4000"}) {
		t.Fatalf("env %v", env)
	}
	_, err = catalog.Parse(fsOf("a", svcA, "c", `{"name":"c","http_port":8089,"local_env":{"T":"{trace_url:a}"}}`))
	if err == nil || !strings.Contains(err.Error(), "unknown placeholder {trace_url:a}") {
		t.Fatalf("{trace_url:a}: error %v, want unknown placeholder", err)
	}
}

func TestParse_RefusesInconsistentDeclarations(t *testing.T) {
	cases := map[string]struct {
		fs   fstest.MapFS
		want string
	}{
		"name differs from folder": {fsOf("x", svcA), `want the folder's name "x"`},
		"unknown field":            {fsOf("a", strings.Replace(svcA, `"publishes"`, `"publish"`, 1)), "unknown field"},
		"port taken twice": {fsOf("a", svcA, "c", `{"name":"c","database":"c","grpc_port":9090,"http_port":8089}`),
			"port 9090 is also"},
		"database shared": {fsOf("a", svcA, "c", `{"name":"c","database":"a","grpc_port":9095,"http_port":8089}`),
			`database "a" is also`},
		"unpublished topic":   {fsOf("b", svcB, "c", strings.Replace(strings.Replace(svcA, `"a"`, `"c"`, 2), "a-events", "c-events", 1)), "which no service publishes"},
		"unknown placeholder": {fsOf("a", strings.Replace(svcA, `}`, `,"local_env":{"X":"{grpc:zzz}"}}`, 1)), "unknown placeholder"},
		"start after cycle": {fsOf("a", strings.Replace(svcA, `"publishes"`, `"start_after":["b"],"publishes"`, 1), "b", svcB),
			"cycle"},
		"two publishers": {fsOf("a", svcA, "c", `{"name":"c","database":"c","grpc_port":9095,"http_port":8089,"publishes":["a-events"]}`),
			"a topic has one owner"},
		"no service": {fstest.MapFS{}, "no */service.json"},
		"grpc of a service without gRPC": {fsOf("a", svcA, "c", `{"name":"c","http_port":8089,"local_env":{"X":"{grpc:c}"}}`),
			"unknown placeholder {grpc:c}"},
		"no HTTP port": {fsOf("a", svcA, "c", `{"name":"c"}`), "port 0 outside"},
		// a's second replica serves HTTP on 8080 + ReplicaPortStep.
		"port of another's replica": {fsOf("a", svcA, "c", `{"name":"c","http_port":8090}`),
			`port 8090 is also "a"'s`},
		// c's second replica would serve HTTP on a's port.
		"replica on another's port": {fsOf("a", svcA, "c", `{"name":"c","http_port":8070}`),
			`port 8080, its replica 2's, is also "a"'s`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := catalog.Parse(tc.fs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
