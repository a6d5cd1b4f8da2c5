package main

import (
	"bytes"
	"strings"
	"testing"
)

// The recorded outputs deploy/deploytest renders from (package directory: deploy/cmd/gcpdeploy).
const outputs = "../../deploytest/testdata/terraform-output.json"

// TestGet: what deploy-gcp.sh reads from the outputs, one value or one line
// per map entry in key order; an unknown name is an error, not an empty line.
func TestGet(t *testing.T) {
	for name, want := range map[string]string{
		"project_id":             "acme-orders-prod\n",
		"sql_instance_name":      "acme-pg\n",
		"namespace":              "orders\n",
		"operator_token_secrets": "acme-billing-operator-token\nacme-console-operator-token\nacme-provider-operator-token\nacme-workorder-operator-token\n",
	} {
		var out bytes.Buffer
		if err := run([]string{"get", "-outputs", outputs, name}, &out); err != nil {
			t.Fatalf("get %s: %v", name, err)
		}
		if out.String() != want {
			t.Errorf("get %s = %q, want %q", name, out.String(), want)
		}
	}
	var out bytes.Buffer
	if err := run([]string{"get", "-outputs", outputs, "sql_privat_ip"}, &out); err == nil || !strings.Contains(err.Error(), `unknown output "sql_privat_ip"`) {
		t.Errorf("get of an unknown output: %v, printed %q", err, out.String())
	}
	if err := run([]string{"render", "-outputs", outputs}, &out); err == nil || !strings.Contains(err.Error(), "-overlay") {
		t.Errorf("render without its flags: %v", err)
	}
}
