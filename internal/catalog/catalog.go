// Package catalog reads the services' declarations: one service.json per
// service folder (services/<name>/service.json), the single list of the
// system's services. `make run` (internal/devtools/localstack) starts what it
// declares, the binaries' `provision` command creates the Pub/Sub topology
// it declares, and deploy/deploytest checks the Makefile, the Dockerfile,
// compose, Prometheus and the alert rules against it. Adding a service is
// adding a folder with a declaration (cmd/newservice writes one); no list in
// code changes.
package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/lossless-dev/lossless/pkg/pubsub"
)

// FileName is the declaration's name inside a service folder.
const FileName = "service.json"

// Service is one service's declaration.
type Service struct {
	// Name of the service, its folder under services/, its binary, its
	// compose service, its Prometheus job and its Dockerfile target.
	Name string `json:"name"`
	// Database is the name of the service's own database (a service owns at
	// most one; the migration sets are migrations.<Name>()). Empty: the
	// service has no database (the console, which reads and acts through
	// the other services' APIs): no DATABASE_URL, no `migrate` command.
	Database string `json:"database,omitempty"`
	// GRPCPort and HTTPPort are the public listeners of replica 1
	// (GRPC_ADDR, HTTP_ADDR; HTTP also serves /healthz and /readyz).
	// GRPCPort 0: the service serves no gRPC API (a {grpc:<name>}
	// placeholder cannot name it) and has no admin listeners. A service
	// with a gRPC API also listens on AdminGRPCPort and AdminHTTPPort.
	GRPCPort int `json:"grpc_port,omitempty"`
	HTTPPort int `json:"http_port"`
	// RESTPath is an example REST resource, printed by `make run`.
	RESTPath string `json:"rest_path,omitempty"`
	// Public: clients outside the cluster call the service's ports (the
	// work-order API, the console). Otherwise only the services whose
	// LocalEnv names its {grpc:...} or {http:...} reach them: the
	// NetworkPolicies of deploy/k8s/base admit exactly those paths
	// (deploy/deploytest checks them against this file).
	Public bool `json:"public,omitempty"`
	// StartAfter names the services that must be ready before this one
	// starts (a dependency it calls, or whose events it consumes).
	StartAfter []string `json:"start_after,omitempty"`
	// Publishes lists the topics the service publishes to (it owns them).
	Publishes []string `json:"publishes,omitempty"`
	// Subscribes lists the topics the service consumes; its subscription is
	// pubsub.SubscriptionID(Name, topic), with a dead-letter topic and an
	// inspection subscription.
	Subscribes []string `json:"subscribes,omitempty"`
	// LocalEnv is added to the service's environment by `make run`, after
	// expanding {instance} (the replica's id, e.g. "billing-2"),
	// {operator_token} (the run's operator token), {grpc:<service>} (the
	// gRPC address of that service's replica with the same number) and
	// {http:<service>} (the base URL of its HTTP listener, e.g.
	// "http://127.0.0.1:8080": REST), {admin_grpc:<service>} and
	// {admin_http:<service>} (the same of its admin listeners: the
	// operator services, /metrics) and {trace_url} (the base
	// URL of the run's trace store, internal/devtools/tracestore; "" when the run
	// collects no traces).
	LocalEnv map[string]string `json:"local_env,omitempty"`
}

// AdminPortOffset is what a service's admin ports add to its public ones
// (the admin gRPC listener of a service on 9090 is 9190; its admin HTTP
// listener, of 8080, 8180).
const AdminPortOffset = 100

// AdminGRPCPort is replica 1's admin gRPC port (ADMIN_GRPC_ADDR), 0 when
// the service has no gRPC API.
func (s Service) AdminGRPCPort() int {
	if s.GRPCPort == 0 {
		return 0
	}
	return s.GRPCPort + AdminPortOffset
}

// AdminHTTPPort is replica 1's admin HTTP port (ADMIN_HTTP_ADDR: the admin
// REST gateway, /metrics), 0 when the service has no gRPC API.
func (s Service) AdminHTTPPort() int {
	if s.GRPCPort == 0 {
		return 0
	}
	return s.HTTPPort + AdminPortOffset
}

// Catalog is every declared service, in start order: a service after every
// service it starts after, ties broken by name.
type Catalog []Service

var (
	nameRE  = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	dbRE    = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	placeRE = regexp.MustCompile(`\{([a-z_]+)(?::([a-z][a-z0-9-]*))?\}`)
)

// Parse reads <dir>/service.json of every folder of fsys (the services/
// folder) that has one, validates the declarations against each other and
// returns them in start order.
func Parse(fsys fs.FS) (Catalog, error) {
	files, err := fs.Glob(fsys, "*/"+FileName)
	if err != nil {
		return nil, err
	}
	var c Catalog
	var errs []error
	for _, f := range files {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		var s Service
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
			continue
		}
		if dir := path.Dir(f); s.Name != dir {
			errs = append(errs, fmt.Errorf("%s: name %q, want the folder's name %q", f, s.Name, dir))
		}
		c = append(c, s)
	}
	if len(files) == 0 {
		errs = append(errs, errors.New("catalog: no */"+FileName+" declares a service"))
	}
	if err := errors.Join(append(errs, c.validate())...); err != nil {
		return nil, err
	}
	return c.ordered()
}

// Load parses every <dir>/<name>/service.json: dir is a services folder
// (the checkout's, or a copy of it mounted into a provisioning job).
func Load(dir string) (Catalog, error) {
	c, err := Parse(os.DirFS(dir))
	if err != nil {
		return nil, fmt.Errorf("%s/*/%s: %w", dir, FileName, err)
	}
	return c, nil
}

// ParseService reads one service's declaration (its service.json, which the
// service's main package embeds) on its own: the checks that need the other
// services (ports, topic owners, placeholders naming them) are Parse's.
func ParseService(b []byte) (Service, error) {
	var s Service
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Service{}, fmt.Errorf("%s: %w", FileName, err)
	}
	if !nameRE.MatchString(s.Name) {
		return Service{}, fmt.Errorf("%s: name %q must match %s", FileName, s.Name, nameRE)
	}
	if err := s.Topology().Validate(); err != nil {
		return Service{}, fmt.Errorf("service %q: %w", s.Name, err)
	}
	return s, nil
}

// Replicas of a service under `make run` listen on its declared ports plus
// ReplicaPortStep × (replica − 1), for up to MaxReplicas replicas; validate
// refuses a port that another service's replica would take.
const (
	ReplicaPortStep = 10
	MaxReplicas     = 9
)

func (c Catalog) validate() error {
	var errs []error
	bad := func(s Service, format string, args ...any) {
		errs = append(errs, fmt.Errorf("service %q: %s", s.Name, fmt.Sprintf(format, args...)))
	}
	names, dbs, ports, publisher := map[string]bool{}, map[string]string{}, map[int]string{}, map[string]string{}
	hasGRPC := map[string]bool{}
	for _, s := range c {
		names[s.Name] = true
		hasGRPC[s.Name] = s.GRPCPort != 0
	}
	for _, s := range c {
		if !nameRE.MatchString(s.Name) {
			bad(s, "name must match %s", nameRE)
		}
		switch other, taken := dbs[s.Database]; {
		case s.Database == "":
		case !dbRE.MatchString(s.Database):
			bad(s, "database %q must match %s", s.Database, dbRE)
		case taken:
			bad(s, "database %q is also %q's: each service owns its own", s.Database, other)
		default:
			dbs[s.Database] = s.Name
		}
		listeners := []int{s.HTTPPort}
		if s.GRPCPort != 0 {
			listeners = append(listeners, s.GRPCPort, s.AdminGRPCPort(), s.AdminHTTPPort())
		}
		for _, p := range listeners {
			if p < 1024 || p+ReplicaPortStep*(MaxReplicas-1) > 65535 {
				bad(s, "port %d outside 1024..%d", p, 65535-ReplicaPortStep*(MaxReplicas-1))
				continue
			}
			for k := range MaxReplicas {
				rp := p + ReplicaPortStep*k
				if other, ok := ports[rp]; ok && other != s.Name {
					if k == 0 {
						bad(s, "port %d is also %q's", rp, other)
					} else {
						bad(s, "port %d, its replica %d's, is also %q's (replicas add %d per replica, up to %d)", rp, k+1, other, ReplicaPortStep, MaxReplicas)
					}
					break
				}
				ports[rp] = s.Name
			}
		}
		for _, d := range s.StartAfter {
			if !names[d] || d == s.Name {
				bad(s, "start_after %q is not another declared service", d)
			}
		}
		for _, tp := range s.Publishes {
			if other, ok := publisher[tp]; ok {
				bad(s, "topic %q is also published by %q: a topic has one owner", tp, other)
			}
			publisher[tp] = s.Name
		}
		for name, v := range s.LocalEnv {
			for _, m := range placeRE.FindAllStringSubmatch(v, -1) {
				switch {
				case (m[1] == "grpc" || m[1] == "admin_grpc" || m[1] == "admin_http") && hasGRPC[m[2]]:
				case m[1] == "http" && names[m[2]]:
				case (m[1] == "instance" || m[1] == "operator_token" || m[1] == "trace_url") && m[2] == "":
				default:
					bad(s, "local_env %s: unknown placeholder %s", name, m[0])
				}
			}
		}
	}
	for _, s := range c {
		for _, tp := range s.Subscribes {
			if _, ok := publisher[tp]; !ok {
				bad(s, "subscribes to %q, which no service publishes", tp)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return c.Topology().Validate()
}

// ordered sorts c topologically by StartAfter, ties by name.
func (c Catalog) ordered() (Catalog, error) {
	rest := slices.Clone(c)
	sort.Slice(rest, func(i, j int) bool { return rest[i].Name < rest[j].Name })
	var out Catalog
	started := map[string]bool{}
	for len(rest) > 0 {
		i := slices.IndexFunc(rest, func(s Service) bool {
			return !slices.ContainsFunc(s.StartAfter, func(d string) bool { return !started[d] })
		})
		if i < 0 {
			var names []string
			for _, s := range rest {
				names = append(names, s.Name)
			}
			return nil, fmt.Errorf("catalog: start_after forms a cycle among %s", strings.Join(names, ", "))
		}
		started[rest[i].Name] = true
		out = append(out, rest[i])
		rest = slices.Delete(rest, i, i+1)
	}
	return out, nil
}

// Names are the services' names in start order.
func (c Catalog) Names() []string {
	out := make([]string, len(c))
	for i, s := range c {
		out[i] = s.Name
	}
	return out
}

// Service returns the declaration of name.
func (c Catalog) Service(name string) (Service, bool) {
	i := slices.IndexFunc(c, func(s Service) bool { return s.Name == name })
	if i < 0 {
		return Service{}, false
	}
	return c[i], true
}

// Topology is the system's Pub/Sub topology: every published topic, and per
// subscribing service its consumer subscription with a dead-letter topic
// and an inspection subscription.
func (c Catalog) Topology() pubsub.Topology {
	var t pubsub.Topology
	for _, s := range c {
		for _, tp := range s.Publishes {
			t.AddTopic(tp)
		}
	}
	for _, s := range c {
		s.addConsumers(&t)
	}
	return t
}

// Topology is the part of the system's topology s declares, what its
// `provision` command creates: the topics it publishes, and per topic it
// consumes that topic, its consumer subscription, the dead-letter topic and
// the inspection subscription. The topic of a consumed topic is created too
// (with the same settings as its publisher's provisioning), so the
// subscription can exist before its publisher is provisioned.
func (s Service) Topology() pubsub.Topology {
	var t pubsub.Topology
	for _, tp := range s.Publishes {
		t.AddTopic(tp)
	}
	s.addConsumers(&t)
	return t
}

func (s Service) addConsumers(t *pubsub.Topology) {
	for _, tp := range s.Subscribes {
		t.AddConsumer(pubsub.SubscriptionID(s.Name, tp), tp)
	}
}

// ExpandEnv returns s's LocalEnv as KEY=value pairs, sorted, with the
// placeholders replaced: {instance} by instance, {operator_token} by token,
// {grpc:<service>} by addr("grpc", service), {http:<service>} by
// addr("http", service), {admin_grpc:<service>} and {admin_http:<service>}
// by addr("admin_grpc", service) and addr("admin_http", service) and
// {trace_url} by addr("trace_url", "").
func (s Service) ExpandEnv(instance, token string, addr func(kind, service string) string) []string {
	out := make([]string, 0, len(s.LocalEnv))
	for name, v := range s.LocalEnv {
		v = placeRE.ReplaceAllStringFunc(v, func(p string) string {
			m := placeRE.FindStringSubmatch(p)
			switch m[1] {
			case "instance":
				return instance
			case "operator_token":
				return token
			case "grpc", "http", "admin_grpc", "admin_http", "trace_url":
				return addr(m[1], m[2])
			}
			return p
		})
		out = append(out, name+"="+v)
	}
	sort.Strings(out)
	return out
}
