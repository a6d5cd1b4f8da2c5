package main

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"go/format"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/template"
)

//go:embed templates
var templates embed.FS

// Names are the spellings of one service name the templates use.
type Names struct {
	Name      string // "order-tracking": folder, binary, compose service, Prometheus job
	Ident     string // "ordertracking": Go and proto package, database, migrations folder
	Camel     string // "OrderTracking": Go identifiers, migrations.OrderTracking()
	EnvPrefix string // "ORDER_TRACKING_"
	Topic     string // "order-tracking-events": the topic it publishes
	Module    string // go.mod's module path
	GRPCPort  int
	HTTPPort  int
	// The admin listeners' ports: the public ones plus
	// catalog.AdminPortOffset (ADR 0026).
	AdminGRPCPort int
	AdminHTTPPort int
}

// Plan is everything the scaffold writes: new files and edits of shared
// files, computed and checked before any is written.
type Plan struct {
	root  string
	names Names
	files map[string][]byte // repository path -> content (new files)
	edits map[string][]byte // repository path -> new content (existing files)
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`)

// reservedPorts are taken by other processes of `make run` and compose: the
// Pub/Sub emulator, and Prometheus's host port.
var reservedPorts = []int{8085, 9099}

// NewPlan validates name against the repository at root and renders every
// file.
func NewPlan(root, name string) (*Plan, error) {
	// 6 to 30 characters: the service's Google service account is named
	// after it (deploy/terraform/gcp/iam.tf), and an account id has 6 to 30.
	if len(name) < 6 || len(name) > 30 || !nameRE.MatchString(name) {
		return nil, fmt.Errorf("NAME %q: want lowercase letters, digits and single hyphens, starting with a letter ([a-z][a-z0-9-]*), 6 to 30 characters (its Google service account is named after it)", name)
	}
	n := Names{Name: name, Ident: strings.ReplaceAll(name, "-", ""), Topic: name + "-events"}
	if token.IsKeyword(n.Ident) {
		return nil, fmt.Errorf("NAME %q: %q is a Go keyword and cannot be a package name", name, n.Ident)
	}
	for _, part := range strings.Split(name, "-") {
		n.Camel += strings.ToUpper(part[:1]) + part[1:]
	}
	n.EnvPrefix = strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_"
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, fmt.Errorf("run from the repository root (or pass -root): %w", err)
	}
	m := regexp.MustCompile(`(?m)^module\s+(\S+)`).FindSubmatch(gomod)
	if m == nil {
		return nil, errors.New("go.mod: no module line")
	}
	n.Module = string(m[1])

	decls, err := declarations(root)
	if err != nil {
		return nil, err
	}
	for _, d := range decls {
		if d.Name == name || d.Database == n.Ident {
			return nil, fmt.Errorf("NAME %q: service %q (database %q) exists already", name, d.Name, d.Database)
		}
	}
	for _, p := range []string{"services/" + name, "migrations/" + n.Ident, "proto/lossless/" + n.Ident, "gen/lossless/" + n.Ident} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			return nil, fmt.Errorf("NAME %q: %s exists already; the scaffold never overwrites", name, p)
		}
	}
	if n.GRPCPort, n.HTTPPort, err = freePorts(decls); err != nil {
		return nil, err
	}
	// The public ports plus 100, as catalog.AdminPortOffset says.
	n.AdminGRPCPort, n.AdminHTTPPort = n.GRPCPort+100, n.HTTPPort+100

	p := &Plan{root: root, names: n, files: map[string][]byte{}, edits: map[string][]byte{}}
	if err := p.render(); err != nil {
		return nil, err
	}
	if err := p.editShared(); err != nil {
		return nil, err
	}
	for rel := range p.files {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel))); err == nil {
			return nil, fmt.Errorf("%s exists already; the scaffold never overwrites", rel)
		}
	}
	return p, nil
}

type declaration struct {
	Name     string `json:"name"`
	Database string `json:"database"`
	GRPCPort int    `json:"grpc_port"`
	HTTPPort int    `json:"http_port"`
}

func declarations(root string) ([]declaration, error) {
	files, err := filepath.Glob(filepath.Join(root, "services", "*", "service.json"))
	if err != nil {
		return nil, err
	}
	var out []declaration
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var d declaration
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// freePorts picks the first gRPC/HTTP pair 9090+i/8080+i (i < 10: replica k
// adds 10×(k−1), so larger offsets would collide with other services'
// replicas) that no declaration and no other process uses.
func freePorts(decls []declaration) (int, int, error) {
	used := slices.Clone(reservedPorts)
	for _, d := range decls {
		used = append(used, d.GRPCPort, d.HTTPPort)
	}
	for i := range 10 {
		g, h := 9090+i, 8080+i
		if !slices.Contains(used, g) && !slices.Contains(used, h) {
			return g, h, nil
		}
	}
	return 0, 0, errors.New("no free port pair 9090+i/8080+i (i < 10) is left: edit grpc_port/http_port of the new services/<name>/service.json by hand")
}

// targets maps each template to the repository path it renders to.
func (n Names) targets() map[string]string {
	svc := "services/" + n.Name + "/"
	return map[string]string{
		"proto.proto.tmpl":        "proto/lossless/" + n.Ident + "/v1/" + n.Ident + ".proto",
		"service.json.tmpl":       svc + "service.json",
		"README.md.tmpl":          svc + "README.md",
		"main.go.tmpl":            svc + "main.go",
		"config.go.tmpl":          svc + "internal/config/config.go",
		"config_test.go.tmpl":     svc + "internal/config/config_test.go",
		"app.go.tmpl":             svc + "internal/app/app.go",
		"service.go.tmpl":         svc + "service.go",
		"api.go.tmpl":             svc + "internal/api/api.go",
		"api_test.go.tmpl":        svc + "internal/api/api_test.go",
		"app_test.go.tmpl":        svc + "internal/app/app_test.go",
		"consumer.go.tmpl":        svc + "internal/itemevents/itemevents.go",
		"consumer_test.go.tmpl":   svc + "internal/itemevents/itemevents_test.go",
		"migration.sql.tmpl":      "migrations/" + n.Ident + "/00001_" + n.Ident + ".sql",
		"runbook.md.tmpl":         "docs/runbooks/" + n.Name + "-down.md",
		"k8s.yaml.tmpl":           "deploy/k8s/base/" + n.Name + ".yaml",
		"k8s_tls_pods.yaml.tmpl":  "deploy/k8s/components/tls-cert-manager/pods-" + n.Name + ".yaml",
		"k8s_snippets.yaml.tmpl":  "", // its defines are inserted into the overlays
		"compose.yaml.tmpl":       "", // inserted into compose.yaml
		"dockerfile.tmpl":         "", // inserted into the Dockerfile
		"migrations.go.tmpl":      "", // appended to migrations.go
		"prometheus_job.yml.tmpl": "", // inserted into prometheus.yml
	}
}

func (p *Plan) render() error {
	tmpl, err := template.New("").Delims("[[", "]]").ParseFS(templates, "templates/*.tmpl")
	if err != nil {
		return err
	}
	for name, target := range p.names.targets() {
		if target == "" {
			continue
		}
		b, err := p.exec(tmpl, name)
		if err != nil {
			return err
		}
		p.files[target] = b
	}
	return nil
}

func (p *Plan) exec(tmpl *template.Template, name string) ([]byte, error) {
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, name, p.names); err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	b := buf.Bytes()
	if strings.HasSuffix(name, ".go.tmpl") && !strings.HasPrefix(name, "migrations.go") {
		formatted, err := format.Source(b)
		if err != nil {
			return nil, fmt.Errorf("template %s renders invalid Go: %w", name, err)
		}
		b = formatted
	}
	return b, nil
}

// Shared files the scaffold edits, relative to the root.
const (
	makefile      = "Makefile"
	dockerfile    = "deploy/docker/Dockerfile"
	composeFile   = "deploy/compose/compose.yaml"
	initdbScript  = "deploy/compose/postgres/initdb.d/10-create-service-databases.sh"
	prometheusYML = "deploy/compose/prometheus/prometheus.yml"
	alertsYML     = "deploy/compose/prometheus/alerts.yml"
	migrationsGo  = "migrations/migrations.go"
	imagesYML     = ".github/workflows/images.yml"
	kindYML       = ".github/workflows/kind.yml"

	k8sBaseKustomization  = "deploy/k8s/base/kustomization.yaml"
	k8sGCPKustomization   = "deploy/k8s/overlays/gcp/kustomization.yaml"
	k8sGCPAccounts        = "deploy/k8s/overlays/gcp/service-accounts.yaml"
	k8sGCPDatabases       = "deploy/k8s/overlays/gcp/database-secrets.yaml"
	k8sGCPTLS             = "deploy/k8s/components/tls-cert-manager/kustomization.yaml"
	k8sGCPCertificates    = "deploy/k8s/components/tls-cert-manager/certificates.yaml"
	k8sGCPPodMonitoring   = "deploy/k8s/components/managed-prometheus/pod-monitoring.yaml"
	k8sGCPOperatorTokens  = "deploy/k8s/components/external-secrets/operator-tokens.yaml"
	k8sLocalKustomization = "deploy/k8s/overlays/local/kustomization.yaml"
	k8sLocalInitdb        = "deploy/k8s/overlays/local/postgres/10-create-service-databases.sh"
)

// edit changes one shared file; fn fails when the file lacks what it
// looks for.
type edit struct {
	file string
	fn   func(string) (string, error)
}

// editShared computes the edits of the shared files; each fails, naming the
// file and the line it looked for, when the file no longer has the shape
// the edit expects.
func (p *Plan) editShared() error {
	tmpl, err := template.New("").Delims("[[", "]]").ParseFS(templates, "templates/*.tmpl")
	if err != nil {
		return err
	}
	snippet := func(name string) string {
		b, err2 := p.exec(tmpl, name)
		if err2 != nil {
			err = errors.Join(err, err2)
		}
		return string(b)
	}
	n := p.names
	edits := []edit{
		{makefile, appendToLine(`(?m)^(SERVICES\s*:=.*?)\s*$`, " "+n.Name)},
		{dockerfile, appendToLine(`(?m)^(\s+\./services/[a-z0-9-]+ \\\n)(?:\s+\./(?:cmd)/)`, "        ./services/"+n.Name+" \\\n")},
		{dockerfile, insertBefore("# cmd/newservice inserts a new service's target above this line.", snippet("dockerfile.tmpl"))},
		{composeFile, insertBefore("  # cmd/newservice inserts a new service (migrate job and server) above this line.", snippet("compose.yaml.tmpl"))},
		{initdbScript, appendToLine(`(?m)^(for db in [a-z0-9_ ]+)(; do)$`, " "+n.Ident)},
		{prometheusYML, insertBefore("  - job_name: prometheus\n", snippet("prometheus_job.yml.tmpl"))},
		{alertsYML, appendToLine(`(up\{job=~"[^"]*)("\} == 0)`, "|"+n.Name)},
		{migrationsGo, appendToLine(`(?m)^(//go:embed [^\n]*?)\s*$`, " "+n.Ident+"/*.sql")},
		{migrationsGo, appendText(snippet("migrations.go.tmpl"))},
		{imagesYML, appendToLine(`(?m)^(\s+service: \[[a-z0-9, -]+)\]$`, ", "+n.Name)},
		// Kubernetes: the base's manifest is a new file (k8s.yaml.tmpl);
		// these add it to the base and give it what each overlay gives
		// every service.
		{k8sBaseKustomization, insertBefore("  - network-policies.yaml\n", snippet("base-resource"))},
		{k8sBaseKustomization, appendLines(snippet("base-image"))},
		{k8sGCPKustomization, insertBefore("\npatches:\n", snippet("gcp-image"))},
		{k8sGCPTLS, insertBefore("  # cmd/newservice inserts a new service's TLS patch above this line.", snippet("gcp-tls-patch"))},
		{k8sGCPKustomization, insertBefore("  # cmd/newservice inserts a new service's ServiceAccount patch above this line.", snippet("gcp-sa-patch"))},
		{k8sGCPAccounts, appendLines(snippet("gcp-service-account"))},
		{k8sGCPDatabases, appendLines(snippet("gcp-database-secret"))},
		{k8sGCPCertificates, appendLines(snippet("gcp-certificate"))},
		{k8sGCPPodMonitoring, appendLines(snippet("gcp-pod-monitoring"))},
		{k8sGCPOperatorTokens, insertBefore("apiVersion: external-secrets.io/v1\nkind: ExternalSecret\n", snippet("gcp-secret-store"))},
		{k8sGCPOperatorTokens, appendLines(snippet("gcp-operator-token"))},
		// make images builds the Makefile's SERVICES; the kind job loads each image.
		{kindYML, appendToLine(`(?m)^(\s+for image in [a-z0-9 -]+)(; do)$`, " "+n.Name)},
		{k8sReadme, appendToLine(`(?m)^(for s in [a-z0-9 -]+)(; do kind load)`, " "+n.Name)},
		{k8sReadme, appendToLine("(Secret `lossless-operator-tokens` \\(keys (?:`[a-z0-9-]+`, )*`[a-z0-9-]+`)(; gcp adds)", ", `"+n.Name+"`")},
		{k8sReadme, appendToLine(`(?m)^(  --from-literal=[a-z0-9-]+=\$\(openssl rand -hex 32\))$`, " \\\n  --from-literal="+n.Name+"=$(openssl rand -hex 32)")},
		{k8sLocalKustomization, insertBefore("  # cmd/newservice inserts a new service's database Secret above this line.", snippet("local-database-secret"))},
		{k8sLocalInitdb, appendToLine(`(?m)^(for db in [a-z0-9_ ]+)(; do)$`, " "+n.Ident)},
	}
	edits = append(edits, connectionEdits(n)...)
	if err != nil {
		return err
	}
	for _, e := range edits {
		cur, ok := p.edits[e.file]
		if !ok {
			b, err := os.ReadFile(filepath.Join(p.root, filepath.FromSlash(e.file)))
			if err != nil {
				return err
			}
			cur = b
		}
		next, err := e.fn(string(cur))
		if err != nil {
			return fmt.Errorf("%s: %w; add the new service there by hand (docs/adding-a-service.md)", e.file, err)
		}
		p.edits[e.file] = []byte(next)
	}
	src, err := format.Source(p.edits[migrationsGo])
	if err != nil {
		return fmt.Errorf("%s after the edit: %w", migrationsGo, err)
	}
	p.edits[migrationsGo] = src
	return nil
}

// appendToLine inserts text after the first submatch of the first match of
// pattern (the rest of the match is kept).
func appendToLine(pattern, text string) func(string) (string, error) {
	re := regexp.MustCompile(pattern)
	return func(s string) (string, error) {
		loc := re.FindStringSubmatchIndex(s)
		if loc == nil {
			return "", fmt.Errorf("no match for %s", pattern)
		}
		return s[:loc[3]] + text + s[loc[3]:], nil
	}
}

func insertBefore(marker, text string) func(string) (string, error) {
	return func(s string) (string, error) {
		i := strings.Index(s, marker)
		if i < 0 {
			return "", fmt.Errorf("no line %q", strings.TrimSpace(marker))
		}
		return s[:i] + text + s[i:], nil
	}
}

// appendLines appends text after the last line.
func appendLines(text string) func(string) (string, error) {
	return func(s string) (string, error) { return strings.TrimRight(s, "\n") + "\n" + text, nil }
}

func appendText(text string) func(string) (string, error) {
	return func(s string) (string, error) { return strings.TrimRight(s, "\n") + "\n\n" + text, nil }
}

// Apply writes the new files, then the edited shared files. Nothing is
// written when a new file's path exists by then.
func (p *Plan) Apply() error {
	paths := make([]string, 0, len(p.files))
	for rel := range p.files {
		paths = append(paths, rel)
	}
	slices.Sort(paths)
	for _, rel := range paths {
		if _, err := os.Stat(filepath.Join(p.root, filepath.FromSlash(rel))); err == nil {
			return fmt.Errorf("%s exists already; the scaffold never overwrites", rel)
		}
	}
	for _, rel := range paths {
		full := filepath.Join(p.root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		// O_EXCL: a file created since the check above is not overwritten.
		f, err := os.OpenFile(full, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		_, err = f.Write(p.files[rel])
		if err := errors.Join(err, f.Close()); err != nil {
			return err
		}
	}
	for rel, b := range p.edits {
		full := filepath.Join(p.root, filepath.FromSlash(rel))
		fi, err := os.Stat(full)
		if err != nil {
			return err
		}
		if err := os.WriteFile(full, b, fi.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// ProtoDir is the new proto package's folder, relative to the root.
func (p *Plan) ProtoDir() string { return path.Join("proto", "lossless", p.names.Ident, "v1") }

// Files lists the new files, sorted.
func (p *Plan) Files() []string {
	out := make([]string, 0, len(p.files))
	for rel := range p.files {
		out = append(out, rel)
	}
	slices.Sort(out)
	return out
}

// Summary tells what was written and what is left to do.
func (p *Plan) Summary() string {
	var b strings.Builder
	n := p.names
	fmt.Fprintf(&b, "service %s created (gRPC :%d, REST :%d, database %s, publishes %s):\n", n.Name, n.GRPCPort, n.HTTPPort, n.Ident, n.Topic)
	for _, f := range p.Files() {
		fmt.Fprintf(&b, "  new     %s\n", f)
	}
	fmt.Fprintf(&b, "  new     gen/lossless/%s/v1/ (generated)\n", n.Ident)
	edited := make([]string, 0, len(p.edits))
	for rel := range p.edits {
		edited = append(edited, rel)
	}
	slices.Sort(edited)
	for _, f := range edited {
		fmt.Fprintf(&b, "  edited  %s\n", f)
	}
	fmt.Fprintf(&b, "  regenerated deploy/terraform/gcp/topology.json (make terraform-topology)\n")
	fmt.Fprintf(&b, "\nConnections at the highest grow by %d (docs/production.md, \"Database connections\"; sql_max_connections follows).\n", addedHighest)
	fmt.Fprintf(&b, "Next: go test ./services/%s/... && (cd deploy && go test ./deploytest), which checks compose, Kubernetes and Terraform;\n"+
		"then docs/adding-a-service.md, \"What is left to the team\" (the operator token, callers and network policies, the domain).\n", n.Name)
	// The init script runs on an empty data directory only.
	fmt.Fprintf(&b, "A PostgreSQL volume of compose or the local overlay from before has no database %s: docker compose down -v,\n"+
		"or create it in place (docs/adding-a-service.md, the SQL after the first commands).\n", n.Ident)
	return b.String()
}
