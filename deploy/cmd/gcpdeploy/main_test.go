package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
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

// TestComponents: the components the committed overlay composes, as
// deploy-gcp.sh reads them to decide what to install.
func TestComponents(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"components", "-overlay", "../../k8s/overlays/gcp"}, &out); err != nil {
		t.Fatal(err)
	}
	if want := "external-secrets\nmanaged-prometheus\ntls-cert-manager\n"; out.String() != want {
		t.Errorf("components = %q, want %q", out.String(), want)
	}
}

// TestRenderSelectsComponents: -components keeps exactly the named ones
// (none when empty, all when absent), and a name the overlay lacks is
// refused, naming it, before anything is deployed without it.
func TestRenderSelectsComponents(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
		err  string
	}{
		{name: "absent", want: "external-secrets\nmanaged-prometheus\ntls-cert-manager\n"},
		{name: "some", args: []string{"-components", "tls-cert-manager, external-secrets"}, want: "external-secrets\ntls-cert-manager\n"},
		{name: "none", args: []string{"-components", ""}, want: ""},
		{name: "typo", args: []string{"-components", "managed-prometheus tls"}, err: `no component "tls"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k8s := filepath.Join(t.TempDir(), "k8s")
			if err := os.CopyFS(k8s, os.DirFS("../../k8s")); err != nil {
				t.Fatal(err)
			}
			overlay := filepath.Join(k8s, "overlays", "gcp")
			args := append([]string{"render", "-outputs", outputs, "-overlay", overlay, "-tag", "t1",
				"-ownership-job", filepath.Join(t.TempDir(), "job.yaml")}, tc.args...)
			err := run(args, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("render %v: %v, want an error containing %q", tc.args, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("render %v: %v", tc.args, err)
			}
			var out bytes.Buffer
			if err := run([]string{"components", "-overlay", overlay}, &out); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("render %v kept components %q, want %q", tc.args, out.String(), tc.want)
			}
			if _, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay); err != nil {
				t.Errorf("render %v: the overlay no longer builds: %v", tc.args, err)
			}
		})
	}
}
