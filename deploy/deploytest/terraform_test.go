package deploytest

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// The Terraform module for Google Cloud and the file it iterates, generated
// from the services' declarations by the main module's
// internal/topology/terraform_test.go (which proves it equals the topology
// `provision` creates).
const (
	terraformDir      = "deploy/terraform/gcp"
	terraformTopology = "topology.json"
)

// The Pub/Sub service agent, with the project number loadTerraform gives
// every project (google_project_service_identity's email).
const tfPubSubAgent = "serviceAccount:service-" + tfTestProjectNumber + "@gcp-sa-pubsub.iam.gserviceaccount.com"

// tfDeclaredService is the part of a service.json the module must cover.
type tfDeclaredService struct {
	Name       string            `json:"name"`
	Database   string            `json:"database"`
	Publishes  []string          `json:"publishes"`
	Subscribes []string          `json:"subscribes"`
	LocalEnv   map[string]string `json:"local_env"`
}

func tfDeclaredServices(t *testing.T) []tfDeclaredService {
	t.Helper()
	var out []tfDeclaredService
	for _, s := range declaredServices(t) {
		var d tfDeclaredService
		if err := json.Unmarshal(readRepoFile(t, "services/"+s.Name+"/service.json"), &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// tfTopologyFile is topology.json as the module reads it.
type tfTopologyFile struct {
	Topics []struct {
		ID                       string  `json:"id"`
		Publisher                *string `json:"publisher"`
		MessageRetentionDuration *string `json:"message_retention_duration"`
	} `json:"topics"`
	Subscriptions []struct {
		ID                       string `json:"id"`
		Topic                    string `json:"topic"`
		Consumer                 string `json:"consumer"`
		AckDeadlineSeconds       int    `json:"ack_deadline_seconds"`
		MessageRetentionDuration string `json:"message_retention_duration"`
		RetryPolicy              *struct {
			MinimumBackoff string `json:"minimum_backoff"`
			MaximumBackoff string `json:"maximum_backoff"`
		} `json:"retry_policy"`
		DeadLetterPolicy *struct {
			DeadLetterTopic     string `json:"dead_letter_topic"`
			MaxDeliveryAttempts int    `json:"max_delivery_attempts"`
		} `json:"dead_letter_policy"`
		EnableMessageOrdering bool   `json:"enable_message_ordering"`
		ExpirationTTL         string `json:"expiration_ttl"`
	} `json:"subscriptions"`
}

func readTFTopology(t *testing.T, dir string) tfTopologyFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, terraformTopology))
	if err != nil {
		t.Fatalf("%v: generate it with `go test ./internal/topology -run TestTerraformTopology -update` in the main module", err)
	}
	var topo tfTopologyFile
	if err := json.Unmarshal(b, &topo); err != nil {
		t.Fatalf("%s: %v", terraformTopology, err)
	}
	if len(topo.Topics) == 0 || len(topo.Subscriptions) == 0 {
		t.Fatalf("%s declares no topic or no subscription", terraformTopology)
	}
	return topo
}

// tfFixture is the module under test with what the checks compare it to.
type tfFixture struct {
	m    *tfModule
	topo tfTopologyFile
	svcs []tfDeclaredService
}

func loadTFFixture(t *testing.T, dir string) tfFixture {
	t.Helper()
	m, problems := loadTerraform(dir)
	if m == nil {
		t.Fatalf("%s does not parse:\n  %s", dir, strings.Join(problems, "\n  "))
	}
	for _, p := range problems {
		t.Error(p)
	}
	return tfFixture{m: m, topo: readTFTopology(t, dir), svcs: tfDeclaredServices(t)}
}

func reportProblems(t *testing.T, problems []string) {
	t.Helper()
	for _, p := range problems {
		t.Error(p)
	}
}

// TestTerraformParsesAndEvaluates: every .tf file parses, the example
// tfvars sets what has no default, every local and for_each evaluates, and
// every argument of every resource instance resolves (a reference to a
// missing resource, attribute or topology field fails here).
func TestTerraformParsesAndEvaluates(t *testing.T) {
	f := loadTFFixture(t, repoPath(t, terraformDir))
	reportProblems(t, checkTFFiles(f))
	reportProblems(t, checkTFEvaluates(f))
}

// TestTerraformPubSubIsTheGeneratedTopology: the topics and subscriptions
// are exactly topology.json's, with its settings, created by for_each over
// local.topology, with no topic or subscription name written in HCL.
func TestTerraformPubSubIsTheGeneratedTopology(t *testing.T) {
	reportProblems(t, checkTFPubSub(loadTFFixture(t, repoPath(t, terraformDir))))
}

// TestTerraformDeadLettering: every consumer subscription of every
// service.json dead-letters to its own topic, which has an inspection
// subscription, and the Pub/Sub service agent may publish to every
// dead-letter topic and acknowledge on every dead-lettering subscription.
func TestTerraformDeadLettering(t *testing.T) {
	reportProblems(t, checkTFDeadLettering(loadTFFixture(t, repoPath(t, terraformDir))))
}

// TestTerraformServiceIdentities: each service of services/*/service.json
// has a Google service account bound by Workload Identity to the Kubernetes
// ServiceAccount named after it, its database, its IAM database user, and
// exactly the Pub/Sub, Cloud SQL, telemetry and secret grants it needs.
func TestTerraformServiceIdentities(t *testing.T) {
	reportProblems(t, checkTFServices(loadTFFixture(t, repoPath(t, terraformDir))))
}

// TestTerraformPlatform: the APIs, the Cloud SQL instance (PostgreSQL 15,
// private IP, IAM authentication, backups with point-in-time recovery,
// deletion protection, max_connections from its variable) and the GKE
// Autopilot cluster (private nodes, REGULAR channel).
func TestTerraformPlatform(t *testing.T) {
	reportProblems(t, checkTFPlatform(loadTFFixture(t, repoPath(t, terraformDir))))
}

// TestTerraformChecksCatchBreakage: each check above fails on a copy of the
// module broken the way it guards against.
func TestTerraformChecksCatchBreakage(t *testing.T) {
	src := repoPath(t, terraformDir)
	cases := []struct {
		name, file, old, new string
		check                func(tfFixture) []string
		want                 string
	}{
		{"syntax error", "sql.tf", `resource "google_sql_database" "service" {`, `resource "google_sql_database" "service" {{`, nil, "sql.tf: syntax"},
		{"unresolved reference", "iam.tf", `google_pubsub_topic.this[each.key].name`, `google_pubsub_topic.this[each.value.topic].name`, checkTFEvaluates,
			`google_pubsub_topic_iam_member.publisher`},
		{"hand-written topic", "pubsub.tf", `resource "google_project_service_identity" "pubsub" {`,
			"resource \"google_pubsub_topic\" \"extra\" {\n  name = \"" + "billing-events" + "\"\n}\n\nresource \"google_project_service_identity\" \"pubsub\" {", checkTFPubSub, "google_pubsub_topic.extra"},
		{"literal topic name", "iam.tf", `topic  = google_pubsub_topic.this[each.key].name`, `topic  = "workorder-events"`, checkTFPubSub, `iam.tf names "workorder-events"`},
		{"drifted ack deadline", "pubsub.tf", `ack_deadline_seconds       = each.value.ack_deadline_seconds`, `ack_deadline_seconds = 30`, checkTFPubSub, "ack_deadline_seconds 30, topology.json 20"},
		{"no dead-letter policy", "pubsub.tf", `for_each = each.value.dead_letter_policy == null ? [] : [each.value.dead_letter_policy]`, `for_each = []`, checkTFDeadLettering, "has no dead_letter_policy"},
		{"agent cannot publish", "pubsub.tf", `for_each = local.dead_letter_topics`, `for_each = {}`, checkTFDeadLettering, "Pub/Sub service agent has no roles/pubsub.publisher on dead-letter topic"},
		{"agent cannot acknowledge", "pubsub.tf", `for_each = local.dead_lettering_subscriptions`, `for_each = {}`, checkTFDeadLettering, "Pub/Sub service agent has no roles/pubsub.subscriber on"},
		{"no database user", "sql.tf", "  for_each = local.databases\n\n  name     = trimsuffix", "  for_each = { for k, v in local.databases : k => v if k != \"billing\" }\n\n  name     = trimsuffix", checkTFServices, `service "billing": no CLOUD_IAM_SERVICE_ACCOUNT database user`},
		{"wrong database", "sql.tf", `name     = each.value.database`, `name     = "${each.value.database}x"`, checkTFServices, "no google_sql_database"},
		{"wrong KSA", "iam.tf", `[${var.namespace}/${each.key}]`, `[${var.namespace}/${each.key}-ksa]`, checkTFServices, "no roles/iam.workloadIdentityUser binding"},
		{"publisher too broad", "iam.tf", `member = google_service_account.service[each.value.publisher].member`, `member = google_service_account.service["workorder"].member`, checkTFServices, `service "workorder": [roles/pubsub.publisher on`},
		{"no trace agent", "iam.tf", `role    = "roles/cloudtrace.agent"`, `role    = "roles/cloudtrace.user"`, checkTFServices, "roles/cloudtrace.agent"},
		{"secret readable by another service", "secrets.tf", `member    = google_service_account.service[each.value.service].member`, `member    = google_service_account.service["billing"].member`, checkTFServices, "secretAccessor"},
		{"IAM authentication off", "sql.tf", `value = "on"`, `value = "off"`, checkTFPlatform, "cloudsql.iam_authentication"},
		{"public IP", "sql.tf", `ipv4_enabled    = false`, `ipv4_enabled    = true`, checkTFPlatform, "ipv4_enabled"},
		{"no PITR", "sql.tf", `point_in_time_recovery_enabled = true`, `point_in_time_recovery_enabled = false`, checkTFPlatform, "point_in_time_recovery_enabled"},
		{"rapid channel", "gke.tf", `channel = "REGULAR"`, `channel = "RAPID"`, checkTFPlatform, "release channel"},
		{"unpinned provider", "versions.tf", "source  = \"hashicorp/google\"\n      version = \"~> 7.0\"", "source  = \"hashicorp/google\"\n      version = \">= 5.0\"", checkTFFiles, "required_providers google (hashicorp/google) version \">= 5.0\": pin a major version"},
		{"unpinned beta provider", "versions.tf", "source  = \"hashicorp/google-beta\"\n      version = \"~> 7.0\"", "source  = \"hashicorp/google-beta\"\n      version = \">= 5.0\"", checkTFFiles, "google-beta (hashicorp/google-beta) version \">= 5.0\": pin a major version"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			copied := false
			entries, err := os.ReadDir(src)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				b, err := os.ReadFile(filepath.Join(src, e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				if e.Name() == tc.file {
					if n := strings.Count(string(b), tc.old); n != 1 {
						t.Fatalf("%s contains %q %d times, want once: update this case", tc.file, tc.old, n)
					}
					b = []byte(strings.Replace(string(b), tc.old, tc.new, 1))
					copied = true
				}
				if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if !copied {
				t.Fatalf("no %s in %s", tc.file, src)
			}
			m, problems := loadTerraform(dir)
			if m != nil && tc.check != nil {
				problems = append(problems, tc.check(tfFixture{m: m, topo: readTFTopology(t, dir), svcs: tfDeclaredServices(t)})...)
			}
			i := slices.IndexFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) })
			if i < 0 {
				t.Fatalf("no problem mentions %q; got:\n  %s", tc.want, strings.Join(problems, "\n  "))
			}
			t.Log(problems[i])
		})
	}
}

var majorPinRE = regexp.MustCompile(`^~>\s*[0-9]+\.[0-9]+$`)

// checkTFFiles: the files by concern exist; Terraform >= 1.6 and the google
// provider pinned to a major version.
func checkTFFiles(f tfFixture) []string {
	var problems []string
	for _, name := range []string{"versions.tf", "variables.tf", "apis.tf", "registry.tf", "pubsub.tf", "sql.tf", "gke.tf", "iam.tf", "secrets.tf", "outputs.tf"} {
		if _, ok := f.m.files[name]; !ok {
			problems = append(problems, "missing "+name)
		}
	}
	var required string
	pins := map[string]string{"google": "", "google-beta": ""} // provider -> version
	for _, body := range f.m.bodies {
		for _, blk := range body.Blocks {
			if blk.Type != "terraform" {
				continue
			}
			if a, ok := blk.Body.Attributes["required_version"]; ok {
				v, _ := a.Expr.Value(nil)
				if v.Type() == cty.String {
					required = v.AsString()
				}
			}
			for _, rp := range blk.Body.Blocks {
				for name := range pins {
					if a, ok := rp.Body.Attributes[name]; rp.Type == "required_providers" && ok {
						v, _ := a.Expr.Value(nil)
						if v.Type().IsObjectType() && v.Type().HasAttribute("source") && v.Type().HasAttribute("version") &&
							v.GetAttr("source").AsString() == "hashicorp/"+name {
							pins[name] = v.GetAttr("version").AsString()
						}
					}
				}
			}
		}
	}
	if required != ">= 1.6" {
		problems = append(problems, fmt.Sprintf("terraform required_version %q, want \">= 1.6\"", required))
	}
	for _, name := range slices.Sorted(maps.Keys(pins)) {
		if !majorPinRE.MatchString(pins[name]) {
			problems = append(problems, fmt.Sprintf("required_providers %s (hashicorp/%s) version %q: pin a major version (\"~> N.0\")", name, name, pins[name]))
		}
	}
	return problems
}

// checkTFEvaluates: every argument of every instance is known.
func checkTFEvaluates(f tfFixture) []string {
	var problems []string
	var walk func(addr, path string, b *tfBody)
	walk = func(addr, path string, b *tfBody) {
		for n, v := range b.attrs {
			if !v.IsWhollyKnown() {
				problems = append(problems, fmt.Sprintf("%s: %s%s does not evaluate", addr, path, n))
			}
		}
		for n, bs := range b.blocks {
			for i, nb := range bs {
				walk(addr, fmt.Sprintf("%s%s[%d].", path, n, i), nb)
			}
		}
	}
	for _, b := range f.m.blocks {
		for k, inst := range b.instances {
			addr := b.addr()
			if b.forEach != nil {
				addr = fmt.Sprintf("%s[%q]", addr, k)
			}
			walk(addr+" ("+b.file+")", "", inst)
		}
	}
	slices.Sort(problems)
	return problems
}

// dependsOnTopology reports whether e reads local.topology, directly or
// through other locals.
func (m *tfModule) dependsOnTopology(e hcl.Expression, seen map[string]bool) bool {
	for _, tr := range e.Variables() {
		if tr.RootName() != "local" || len(tr) < 2 {
			continue
		}
		attr, ok := tr[1].(hcl.TraverseAttr)
		if !ok || seen[attr.Name] {
			continue
		}
		if attr.Name == "topology" {
			return true
		}
		seen[attr.Name] = true
		if le, ok := m.localExprs[attr.Name]; ok && m.dependsOnTopology(le, seen) {
			return true
		}
	}
	return false
}

func (f tfFixture) projectID() string { return f.m.vars["project_id"].AsString() }

func (f tfFixture) topicID(name string) string {
	return "projects/" + f.projectID() + "/topics/" + name
}

// shortName strips "projects/<project>/<kind>/" from a resource name.
func shortName(s string) string {
	if parts := strings.Split(s, "/"); len(parts) == 4 && parts[0] == "projects" {
		return parts[3]
	}
	return s
}

func checkTFPubSub(f tfFixture) []string {
	var problems []string
	for _, typ := range []string{"google_pubsub_topic", "google_pubsub_subscription", "google_pubsub_topic_iam_member", "google_pubsub_subscription_iam_member"} {
		for _, b := range f.m.resources(typ) {
			if b.forEach == nil || !f.m.dependsOnTopology(b.forEach.Expr, map[string]bool{}) {
				problems = append(problems, fmt.Sprintf("%s (%s): want for_each over local.topology (topology.json), not a hand-written resource", b.addr(), b.file))
			}
		}
	}
	// Names from topology.json never appear in HCL: a literal would be a
	// second declaration that could drift from the generated one.
	var names []string
	for _, tp := range f.topo.Topics {
		names = append(names, tp.ID)
	}
	for _, s := range f.topo.Subscriptions {
		names = append(names, s.ID)
	}
	for file, src := range f.m.files {
		for _, n := range names {
			if strings.Contains(string(src), `"`+n+`"`) || strings.Contains(string(src), n+".") || strings.Contains(string(src), " "+n) {
				problems = append(problems, fmt.Sprintf("%s names %q: topics and subscriptions come from topology.json only", file, n))
			}
		}
	}

	topics := map[string]*tfBody{}
	for addr, inst := range f.m.instancesOf("google_pubsub_topic") {
		name := inst.str("name")
		if _, dup := topics[name]; dup || name == "" {
			problems = append(problems, fmt.Sprintf("%s: topic name %q empty or declared twice", addr, name))
		}
		topics[name] = inst
	}
	want := map[string]bool{}
	for _, tp := range f.topo.Topics {
		want[tp.ID] = true
		inst, ok := topics[tp.ID]
		if !ok {
			problems = append(problems, fmt.Sprintf("topic %q of topology.json is not created", tp.ID))
			continue
		}
		got := inst.attrs["message_retention_duration"]
		switch {
		case tp.MessageRetentionDuration == nil && got != cty.NilVal && !got.IsNull():
			problems = append(problems, fmt.Sprintf("topic %q: message_retention_duration %#v, topology.json none", tp.ID, got))
		case tp.MessageRetentionDuration != nil && inst.str("message_retention_duration") != *tp.MessageRetentionDuration:
			problems = append(problems, fmt.Sprintf("topic %q: message_retention_duration %q, topology.json %q", tp.ID, inst.str("message_retention_duration"), *tp.MessageRetentionDuration))
		}
	}
	for name := range topics {
		if !want[name] {
			problems = append(problems, fmt.Sprintf("topic %q is not in topology.json", name))
		}
	}

	subs := map[string]*tfBody{}
	for addr, inst := range f.m.instancesOf("google_pubsub_subscription") {
		name := inst.str("name")
		if _, dup := subs[name]; dup || name == "" {
			problems = append(problems, fmt.Sprintf("%s: subscription name %q empty or declared twice", addr, name))
		}
		subs[name] = inst
	}
	want = map[string]bool{}
	for _, s := range f.topo.Subscriptions {
		want[s.ID] = true
		inst, ok := subs[s.ID]
		if !ok {
			problems = append(problems, fmt.Sprintf("subscription %q of topology.json is not created", s.ID))
			continue
		}
		bad := func(format string, args ...any) {
			problems = append(problems, fmt.Sprintf("subscription %q: ", s.ID)+fmt.Sprintf(format, args...))
		}
		if got := inst.str("topic"); got != f.topicID(s.Topic) {
			bad("topic %q, topology.json %q", got, f.topicID(s.Topic))
		}
		if got := inst.str("ack_deadline_seconds"); got != fmt.Sprint(s.AckDeadlineSeconds) {
			bad("ack_deadline_seconds %s, topology.json %d", got, s.AckDeadlineSeconds)
		}
		if got := inst.str("message_retention_duration"); got != s.MessageRetentionDuration {
			bad("message_retention_duration %q, topology.json %q", got, s.MessageRetentionDuration)
		}
		if got := inst.str("enable_message_ordering"); got != fmt.Sprint(s.EnableMessageOrdering) {
			bad("enable_message_ordering %s, topology.json %v", got, s.EnableMessageOrdering)
		}
		if ep := inst.blocks["expiration_policy"]; len(ep) != 1 || ep[0].attrs["ttl"] != cty.StringVal(s.ExpirationTTL) {
			bad("want one expiration_policy with ttl %q (topology.json)", s.ExpirationTTL)
		}
		rp := inst.blocks["retry_policy"]
		switch {
		case s.RetryPolicy == nil && len(rp) != 0:
			bad("has a retry_policy, topology.json none")
		case s.RetryPolicy != nil && (len(rp) != 1 || rp[0].str("minimum_backoff") != s.RetryPolicy.MinimumBackoff || rp[0].str("maximum_backoff") != s.RetryPolicy.MaximumBackoff):
			bad("retry_policy differs from topology.json's [%s, %s]", s.RetryPolicy.MinimumBackoff, s.RetryPolicy.MaximumBackoff)
		}
		dl := inst.blocks["dead_letter_policy"]
		switch {
		case s.DeadLetterPolicy == nil && len(dl) != 0:
			bad("has a dead_letter_policy, topology.json none")
		case s.DeadLetterPolicy != nil && len(dl) != 1:
			bad("has no dead_letter_policy, topology.json dead-letters to %q", s.DeadLetterPolicy.DeadLetterTopic)
		case s.DeadLetterPolicy != nil && (dl[0].str("dead_letter_topic") != f.topicID(s.DeadLetterPolicy.DeadLetterTopic) ||
			dl[0].str("max_delivery_attempts") != fmt.Sprint(s.DeadLetterPolicy.MaxDeliveryAttempts)):
			bad("dead_letter_policy (%s, %s), topology.json (%s, %d)", dl[0].str("dead_letter_topic"), dl[0].str("max_delivery_attempts"),
				f.topicID(s.DeadLetterPolicy.DeadLetterTopic), s.DeadLetterPolicy.MaxDeliveryAttempts)
		}
	}
	for name := range subs {
		if !want[name] {
			problems = append(problems, fmt.Sprintf("subscription %q is not in topology.json", name))
		}
	}
	slices.Sort(problems)
	return problems
}

// tfGrant is one evaluated IAM member resource instance.
type tfGrant struct{ resource, role, member string }

// grants returns the IAM members of a type, by the resource they are on
// (attr names it), short names for Pub/Sub and secrets.
func (f tfFixture) grants(typ, attr string) []tfGrant {
	var out []tfGrant
	for _, inst := range f.m.instancesOf(typ) {
		out = append(out, tfGrant{resource: shortName(inst.str(attr)), role: inst.str("role"), member: inst.str("member")})
	}
	return out
}

func hasGrant(gs []tfGrant, g tfGrant) bool { return slices.Contains(gs, g) }

func checkTFDeadLettering(f tfFixture) []string {
	var problems []string
	subs := map[string]*tfBody{}
	for _, inst := range f.m.instancesOf("google_pubsub_subscription") {
		subs[inst.str("name")] = inst
	}
	topics := map[string]bool{}
	for _, inst := range f.m.instancesOf("google_pubsub_topic") {
		topics[inst.str("name")] = true
	}
	topicGrants := f.grants("google_pubsub_topic_iam_member", "topic")
	subGrants := f.grants("google_pubsub_subscription_iam_member", "subscription")
	// Independently of topology.json: every declared consumer, with
	// pkg/pubsub's naming (SubscriptionID, DeadLetterTopicID,
	// DeadLetterInspectionID).
	for _, svc := range f.svcs {
		for _, tp := range svc.Subscribes {
			sub := svc.Name + "." + tp
			inst, ok := subs[sub]
			if !ok {
				problems = append(problems, fmt.Sprintf("service %q consumes %q: no subscription %q", svc.Name, tp, sub))
				continue
			}
			dl := inst.blocks["dead_letter_policy"]
			if len(dl) != 1 || dl[0].str("dead_letter_topic") != f.topicID(sub+".dead-letter") {
				problems = append(problems, fmt.Sprintf("consumer subscription %q has no dead_letter_policy to %q", sub, sub+".dead-letter"))
			} else if n, err := strconv.Atoi(dl[0].str("max_delivery_attempts")); err != nil || n < 5 || n > 100 {
				problems = append(problems, fmt.Sprintf("consumer subscription %q: max_delivery_attempts %q outside 5..100", sub, dl[0].str("max_delivery_attempts")))
			}
			if !topics[sub+".dead-letter"] {
				problems = append(problems, fmt.Sprintf("consumer subscription %q: no dead-letter topic %q", sub, sub+".dead-letter"))
			}
			if insp, ok := subs[sub+".dead-letter-inspect"]; !ok || insp.str("topic") != f.topicID(sub+".dead-letter") {
				problems = append(problems, fmt.Sprintf("consumer subscription %q: no inspection subscription %q on its dead-letter topic", sub, sub+".dead-letter-inspect"))
			}
		}
	}
	// The service agent on every dead-letter topic any subscription names,
	// and on every subscription that dead-letters.
	for name, inst := range subs {
		for _, dl := range inst.blocks["dead_letter_policy"] {
			topic := shortName(dl.str("dead_letter_topic"))
			if !hasGrant(topicGrants, tfGrant{topic, "roles/pubsub.publisher", tfPubSubAgent}) {
				problems = append(problems, fmt.Sprintf("the Pub/Sub service agent has no roles/pubsub.publisher on dead-letter topic %q", topic))
			}
			if !hasGrant(subGrants, tfGrant{name, "roles/pubsub.subscriber", tfPubSubAgent}) {
				problems = append(problems, fmt.Sprintf("the Pub/Sub service agent has no roles/pubsub.subscriber on %q, which dead-letters", name))
			}
		}
	}
	slices.Sort(problems)
	return problems
}

func checkTFServices(f tfFixture) []string {
	var problems []string
	project := f.projectID()
	namespace := f.m.vars["namespace"].AsString()
	accounts := map[string]*tfBody{} // "projects/p/serviceAccounts/<email>" -> account
	for _, inst := range f.m.instancesOf("google_service_account") {
		accounts["projects/"+project+"/serviceAccounts/"+inst.str("account_id")+"@"+project+".iam.gserviceaccount.com"] = inst
	}
	wi := map[string]string{} // KSA member -> GSA email
	for _, inst := range f.m.instancesOf("google_service_account_iam_member") {
		if inst.str("role") == "roles/iam.workloadIdentityUser" {
			if _, ok := accounts[inst.str("service_account_id")]; ok {
				wi[inst.str("member")] = shortName(inst.str("service_account_id"))
			}
		}
	}
	instance := ""
	for _, inst := range f.m.instancesOf("google_sql_database_instance") {
		instance = inst.str("name")
	}
	databases := map[string]bool{}
	for _, inst := range f.m.instancesOf("google_sql_database") {
		if inst.str("instance") == instance {
			databases[inst.str("name")] = true
		}
	}
	users := map[string]bool{}
	for _, inst := range f.m.instancesOf("google_sql_user") {
		if inst.str("instance") == instance && inst.str("type") == "CLOUD_IAM_SERVICE_ACCOUNT" {
			users[inst.str("name")] = true
		}
	}
	projectRoles := map[string][]string{} // member -> roles
	for _, inst := range f.m.instancesOf("google_project_iam_member") {
		projectRoles[inst.str("member")] = append(projectRoles[inst.str("member")], inst.str("role"))
	}
	topicGrants := f.grants("google_pubsub_topic_iam_member", "topic")
	subGrants := f.grants("google_pubsub_subscription_iam_member", "subscription")
	secretGrants := f.grants("google_secret_manager_secret_iam_member", "secret_id")
	secrets := map[string]bool{}
	for _, inst := range f.m.instancesOf("google_secret_manager_secret") {
		secrets[inst.str("secret_id")] = true
	}

	for _, svc := range f.svcs {
		bad := func(format string, args ...any) {
			problems = append(problems, fmt.Sprintf("service %q: ", svc.Name)+fmt.Sprintf(format, args...))
		}
		ksa := "serviceAccount:" + project + ".svc.id.goog[" + namespace + "/" + svc.Name + "]"
		email, ok := wi[ksa]
		if !ok {
			bad("no roles/iam.workloadIdentityUser binding of %s to a google_service_account", ksa)
			continue
		}
		member := "serviceAccount:" + email
		user := strings.TrimSuffix(email, ".gserviceaccount.com")
		wantRoles := []string{"roles/cloudtrace.agent", "roles/monitoring.metricWriter"}
		if svc.Database != "" {
			wantRoles = append(wantRoles, "roles/cloudsql.client", "roles/cloudsql.instanceUser")
			if !databases[svc.Database] {
				bad("no google_sql_database %q on instance %q", svc.Database, instance)
			}
			if !users[user] {
				bad("no CLOUD_IAM_SERVICE_ACCOUNT database user %q", user)
			}
		} else if users[user] {
			bad("declares no database but has database user %q", user)
		}
		roles := slices.Sorted(slices.Values(projectRoles[member]))
		if wantRoles = slices.Sorted(slices.Values(wantRoles)); !slices.Equal(roles, wantRoles) {
			bad("project roles %v, want exactly %v", roles, wantRoles)
		}
		var published, wantPublished []string
		for _, g := range topicGrants {
			if g.member == member {
				published = append(published, g.role+" on "+g.resource)
			}
		}
		for _, tp := range svc.Publishes {
			wantPublished = append(wantPublished, "roles/pubsub.publisher on "+tp)
		}
		if slices.Sort(published); !slices.Equal(published, slices.Sorted(slices.Values(wantPublished))) {
			bad("%v, want exactly %v (the topics it publishes)", published, slices.Sorted(slices.Values(wantPublished)))
		}
		var consumed, wantConsumed []string
		for _, g := range subGrants {
			if g.member == member {
				consumed = append(consumed, g.role+" on "+g.resource)
			}
		}
		for _, tp := range svc.Subscribes {
			wantConsumed = append(wantConsumed, "roles/pubsub.subscriber on "+svc.Name+"."+tp, "roles/pubsub.subscriber on "+svc.Name+"."+tp+".dead-letter-inspect")
		}
		if slices.Sort(consumed); !slices.Equal(consumed, slices.Sorted(slices.Values(wantConsumed))) {
			bad("%v, want exactly %v (its subscriptions and their inspection subscriptions)", consumed, slices.Sorted(slices.Values(wantConsumed)))
		}
		var readable, wantReadable []string
		for _, g := range secretGrants {
			if g.member == member {
				readable = append(readable, g.role+" on "+g.resource)
			}
		}
		prefix := f.m.vars["name_prefix"].AsString()
		for env, v := range svc.LocalEnv {
			if v == "{operator_token}" {
				id := prefix + "-" + strings.ReplaceAll(strings.ToLower(env), "_", "-")
				if !secrets[id] {
					bad("reads %s: no google_secret_manager_secret %q", env, id)
				}
				wantReadable = append(wantReadable, "roles/secretmanager.secretAccessor on "+id)
			}
		}
		if slices.Sort(readable); !slices.Equal(readable, slices.Sorted(slices.Values(wantReadable))) {
			bad("secrets %v, want exactly %v (its operator tokens; roles/secretmanager.secretAccessor)", readable, slices.Sorted(slices.Values(wantReadable)))
		}
	}
	slices.Sort(problems)
	return problems
}

func checkTFPlatform(f tfFixture) []string {
	var problems []string
	apis := map[string]bool{}
	for _, inst := range f.m.instancesOf("google_project_service") {
		apis[inst.str("service")] = true
	}
	for _, api := range []string{"pubsub", "sqladmin", "container", "artifactregistry", "secretmanager", "iam", "monitoring", "logging", "cloudtrace"} {
		if !apis[api+".googleapis.com"] {
			problems = append(problems, fmt.Sprintf("API %s.googleapis.com is not enabled (google_project_service)", api))
		}
	}
	if len(f.m.instancesOf("google_artifact_registry_repository")) != 1 {
		problems = append(problems, "want one google_artifact_registry_repository")
	}
	for _, inst := range f.m.instancesOf("google_artifact_registry_repository") {
		if inst.str("format") != "DOCKER" {
			problems = append(problems, "the Artifact Registry repository is not DOCKER")
		}
	}

	sqls := f.m.instancesOf("google_sql_database_instance")
	if len(sqls) != 1 {
		problems = append(problems, fmt.Sprintf("want one google_sql_database_instance, have %d", len(sqls)))
	}
	for addr, inst := range sqls {
		bad := func(format string, args ...any) { problems = append(problems, addr+": "+fmt.Sprintf(format, args...)) }
		if inst.str("database_version") != "POSTGRES_15" {
			bad("database_version %q, want POSTGRES_15", inst.str("database_version"))
		}
		if inst.str("deletion_protection") != "true" {
			bad("deletion_protection is not true by default")
		}
		settings := one(inst, "settings")
		if settings.str("deletion_protection_enabled") != "true" {
			bad("settings.deletion_protection_enabled is not true by default")
		}
		ip := one(settings, "ip_configuration")
		if ip.str("ipv4_enabled") != "false" || ip.str("private_network") == "" {
			bad("ip_configuration: want ipv4_enabled false and a private_network (private IP only)")
		}
		backup := one(settings, "backup_configuration")
		if backup.str("enabled") != "true" || backup.str("point_in_time_recovery_enabled") != "true" {
			bad("backup_configuration: want enabled and point_in_time_recovery_enabled")
		}
		flags := map[string]string{}
		for _, fl := range settings.blocks["database_flags"] {
			flags[fl.str("name")] = fl.str("value")
		}
		if flags["cloudsql.iam_authentication"] != "on" {
			bad("database flag cloudsql.iam_authentication %q, want on", flags["cloudsql.iam_authentication"])
		}
		if want := f.m.vars["sql_max_connections"]; flags["max_connections"] == "" || flags["max_connections"] != want.AsBigFloat().String() {
			bad("database flag max_connections %q, want var.sql_max_connections (%s)", flags["max_connections"], want.AsBigFloat().String())
		}
	}

	gkes := f.m.instancesOf("google_container_cluster")
	if len(gkes) != 1 {
		problems = append(problems, fmt.Sprintf("want one google_container_cluster, have %d", len(gkes)))
	}
	for addr, inst := range gkes {
		if inst.str("enable_autopilot") != "true" {
			problems = append(problems, addr+": not Autopilot")
		}
		if one(inst, "private_cluster_config").str("enable_private_nodes") != "true" {
			problems = append(problems, addr+": nodes are not private")
		}
		if ch := one(inst, "release_channel").str("channel"); ch != "REGULAR" {
			problems = append(problems, fmt.Sprintf("%s: release channel %q, want REGULAR", addr, ch))
		}
	}
	slices.Sort(problems)
	return problems
}

// one returns the single nested block of a type, or an empty body.
func one(b *tfBody, typ string) *tfBody {
	if bs := b.blocks[typ]; len(bs) == 1 {
		return bs[0]
	}
	return &tfBody{attrs: map[string]cty.Value{}, blocks: map[string][]*tfBody{}}
}
