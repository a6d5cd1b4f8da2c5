package topology_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lossless-dev/lossless/internal/catalog"
	"github.com/lossless-dev/lossless/internal/devtools/declared"
	"github.com/lossless-dev/lossless/internal/topology"
	"github.com/lossless-dev/lossless/pkg/pubsub"
)

var update = flag.Bool("update", false, "rewrite deploy/terraform/gcp/topology.json from the declared topology")

// terraformTopologyFile is what deploy/terraform/gcp iterates to create the
// Pub/Sub resources and their IAM, relative to this package's directory.
const terraformTopologyFile = "../../deploy/terraform/gcp/topology.json"

// tfTopology is the system's shape as the Terraform module reads it: the
// settings of every topic and subscription exactly as pubsub.Provision
// sends them, plus who owns each (for least-privilege IAM). Durations are in
// the provider's "<seconds>s" form, absent settings are null.
type tfTopology struct {
	Generated      string           `json:"_generated"`
	Services       []tfService      `json:"services"`
	OperatorTokens []tfSecret       `json:"operator_tokens"`
	Topics         []tfTopic        `json:"topics"`
	Subscriptions  []tfSubscription `json:"subscriptions"`
}

type tfService struct {
	Name string `json:"name"`
	// Database is null for a service without one (no Cloud SQL user or role).
	Database *string `json:"database"`
}

// tfSecret is an environment variable a service reads an operator token
// from: one its local_env sets to {operator_token}. Terraform creates a
// Secret Manager secret for it, readable by that service only.
type tfSecret struct {
	Service  string `json:"service"`
	Env      string `json:"env"`
	SecretID string `json:"secret_id"`
}

type tfTopic struct {
	ID string `json:"id"`
	// Publisher is the service publishing to the topic; null for a
	// dead-letter topic, which only the Pub/Sub service agent publishes to.
	Publisher *string `json:"publisher"`
	// DeadLetterOf is the subscription whose dead letters the topic receives.
	DeadLetterOf             *string `json:"dead_letter_of"`
	MessageRetentionDuration *string `json:"message_retention_duration"`
}

type tfSubscription struct {
	ID    string `json:"id"`
	Topic string `json:"topic"`
	// Consumer is the service that pulls from it: for a dead-letter
	// inspection subscription, the consumer of the inspected subscription
	// (its dead-letter monitor and replay read it).
	Consumer                 string              `json:"consumer"`
	Kind                     string              `json:"kind"` // "consumer" or "dead-letter-inspection"
	AckDeadlineSeconds       int                 `json:"ack_deadline_seconds"`
	MessageRetentionDuration string              `json:"message_retention_duration"`
	RetryPolicy              *tfRetryPolicy      `json:"retry_policy"`
	DeadLetterPolicy         *tfDeadLetterPolicy `json:"dead_letter_policy"`
	EnableMessageOrdering    bool                `json:"enable_message_ordering"`
	// ExpirationTTL "" is Provision's empty expiration policy: never expire.
	ExpirationTTL string `json:"expiration_ttl"`
}

type tfRetryPolicy struct {
	MinimumBackoff string `json:"minimum_backoff"`
	MaximumBackoff string `json:"maximum_backoff"`
}

type tfDeadLetterPolicy struct {
	DeadLetterTopic     string `json:"dead_letter_topic"`
	MaxDeliveryAttempts int    `json:"max_delivery_attempts"`
}

const (
	kindConsumer   = "consumer"
	kindInspection = "dead-letter-inspection"
)

func seconds(d time.Duration) string { return fmt.Sprintf("%ds", int64(d/time.Second)) }

// renderTerraformTopology derives the file from topo, c.Topology() (the
// settings), and the catalog (the owners), with pkg/pubsub's naming rules;
// every topic and subscription of topo must get an owner, or this fails.
func renderTerraformTopology(c catalog.Catalog, topo pubsub.Topology) (tfTopology, error) {
	out := tfTopology{
		Generated:      "by `go test ./internal/topology -run TestTerraformTopology -update` from services/*/service.json; do not edit",
		OperatorTokens: []tfSecret{},
	}
	publisher := map[string]string{}
	deadLetterOf := map[string]string{}
	consumer := map[string]string{}
	kind := map[string]string{}
	for _, s := range c {
		svc := tfService{Name: s.Name}
		if s.Database != "" {
			svc.Database = &s.Database
		}
		out.Services = append(out.Services, svc)
		for _, env := range sortedKeys(s.LocalEnv) {
			if s.LocalEnv[env] == "{operator_token}" {
				out.OperatorTokens = append(out.OperatorTokens, tfSecret{Service: s.Name, Env: env,
					SecretID: strings.ReplaceAll(strings.ToLower(env), "_", "-")})
			}
		}
		for _, tp := range s.Publishes {
			publisher[tp] = s.Name
		}
		for _, tp := range s.Subscribes {
			sub := pubsub.SubscriptionID(s.Name, tp)
			consumer[sub], kind[sub] = s.Name, kindConsumer
			insp := pubsub.DeadLetterInspectionID(sub)
			consumer[insp], kind[insp] = s.Name, kindInspection
			deadLetterOf[pubsub.DeadLetterTopicID(sub)] = sub
		}
	}
	for _, tp := range topo.Topics {
		t := tfTopic{ID: tp.ID}
		if p, ok := publisher[tp.ID]; ok {
			t.Publisher = &p
		} else if sub, ok := deadLetterOf[tp.ID]; ok {
			t.DeadLetterOf = &sub
		} else {
			return out, fmt.Errorf("topic %q has neither a publishing service nor a subscription it is the dead-letter topic of", tp.ID)
		}
		if tp.MessageRetention > 0 {
			r := seconds(tp.MessageRetention)
			t.MessageRetentionDuration = &r
		}
		out.Topics = append(out.Topics, t)
	}
	for _, s := range topo.Subscriptions {
		cons, ok := consumer[s.ID]
		if !ok {
			return out, fmt.Errorf("subscription %q has no consuming service", s.ID)
		}
		sub := tfSubscription{
			ID: s.ID, Topic: s.Topic, Consumer: cons, Kind: kind[s.ID],
			AckDeadlineSeconds:       int(s.AckDeadline / time.Second),
			MessageRetentionDuration: seconds(s.MessageRetention),
			EnableMessageOrdering:    s.EnableOrdering,
		}
		if s.RetryMinBackoff != 0 || s.RetryMaxBackoff != 0 {
			sub.RetryPolicy = &tfRetryPolicy{MinimumBackoff: seconds(s.RetryMinBackoff), MaximumBackoff: seconds(s.RetryMaxBackoff)}
		}
		if s.DeadLetterTopic != "" {
			sub.DeadLetterPolicy = &tfDeadLetterPolicy{DeadLetterTopic: s.DeadLetterTopic, MaxDeliveryAttempts: s.MaxDeliveryAttempts}
		}
		out.Subscriptions = append(out.Subscriptions, sub)
	}
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func marshalTopology(t *testing.T, tf tfTopology) []byte {
	t.Helper()
	b, err := json.MarshalIndent(tf, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// TestTerraformTopology: the committed topology.json, from which the
// Terraform module creates every topic, subscription and their IAM, equals
// what the declared topology (what the services' `provision` commands create
// together) renders to. With -update it rewrites the file.
func TestTerraformTopology(t *testing.T) {
	c, err := declared.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	want, err := renderTerraformTopology(c, c.Topology())
	if err != nil {
		t.Fatal(err)
	}
	wantBytes := marshalTopology(t, want)
	path := filepath.FromSlash(terraformTopologyFile)
	if *update {
		if err := os.WriteFile(path, wantBytes, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: generate it with `go test ./internal/topology -run TestTerraformTopology -update`", err)
	}
	if bytes.Equal(got, wantBytes) {
		return
	}
	var committed tfTopology
	if err := json.Unmarshal(got, &committed); err != nil {
		t.Fatalf("%s does not parse (%v); regenerate it with `go test ./internal/topology -run TestTerraformTopology -update`", path, err)
	}
	diffs := diffTopology(committed, want)
	if len(diffs) == 0 {
		diffs = []string{"same content, different formatting or order"}
	}
	t.Errorf("%s differs from the topology the services' `provision` commands create:\n  %s\nrun `go test ./internal/topology -run TestTerraformTopology -update` and commit the file",
		path, strings.Join(diffs, "\n  "))
}

// TestTerraformTopology_DiffNamesTheDifference: a drifted setting, a
// missing and an extra subscription are each reported by name, so a failure
// of TestTerraformTopology says what differs.
func TestTerraformTopology_DiffNamesTheDifference(t *testing.T) {
	c, err := declared.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	want, err := renderTerraformTopology(c, c.Topology())
	if err != nil {
		t.Fatal(err)
	}
	var committed tfTopology
	if err := json.Unmarshal(marshalTopology(t, want), &committed); err != nil {
		t.Fatal(err)
	}
	committed.Subscriptions[0].AckDeadlineSeconds = 30
	removed := committed.Subscriptions[1].ID
	committed.Subscriptions = slices.Delete(committed.Subscriptions, 1, 2)
	committed.Subscriptions = append(committed.Subscriptions, tfSubscription{ID: "stale.sub", Topic: topology.TopicBillingEvents})
	got := strings.Join(diffTopology(committed, want), "\n")
	for _, frag := range []string{
		fmt.Sprintf("subscription %q: committed {", want.Subscriptions[0].ID),
		`"ack_deadline_seconds":30`,
		fmt.Sprintf("subscription %q: missing from the committed file", removed),
		`subscription "stale.sub": in the committed file, not declared`,
	} {
		if !strings.Contains(got, frag) {
			t.Errorf("diff does not contain %q:\n%s", frag, got)
		}
	}
}

// diffTopology names each service, topic and subscription that is missing,
// extra or different between the committed file and the declared topology's rendering.
func diffTopology(committed, want tfTopology) []string {
	var diffs []string
	diffs = append(diffs, diffByID("service", committed.Services, want.Services, func(s tfService) string { return s.Name })...)
	diffs = append(diffs, diffByID("operator token", committed.OperatorTokens, want.OperatorTokens, func(s tfSecret) string { return s.Env })...)
	diffs = append(diffs, diffByID("topic", committed.Topics, want.Topics, func(tp tfTopic) string { return tp.ID })...)
	diffs = append(diffs, diffByID("subscription", committed.Subscriptions, want.Subscriptions, func(s tfSubscription) string { return s.ID })...)
	return diffs
}

func diffByID[T any](what string, committed, want []T, id func(T) string) []string {
	enc := func(v T) string {
		b, _ := json.Marshal(v) // plain structs of strings, ints and bools
		return string(b)
	}
	have := map[string]string{}
	for _, v := range committed {
		have[id(v)] = enc(v)
	}
	var diffs []string
	seen := map[string]bool{}
	for _, v := range want {
		k := id(v)
		seen[k] = true
		switch h, ok := have[k]; {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s %q: missing from the committed file", what, k))
		case h != enc(v):
			diffs = append(diffs, fmt.Sprintf("%s %q: committed %s, declared %s", what, k, h, enc(v)))
		}
	}
	for _, v := range committed {
		if k := id(v); !seen[k] {
			diffs = append(diffs, fmt.Sprintf("%s %q: in the committed file, not declared", what, k))
		}
	}
	return diffs
}
