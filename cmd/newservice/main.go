// Command newservice is `make new-service NAME=<name>`: it scaffolds a
// working service in the repository: a proto contract with one RPC (and the
// regenerated gen/ code), services/<name> (serve|migrate|provision, config,
// app, API writing a row and an outbox event in one transaction, tests on
// real PostgreSQL, README), its declaration services/<name>/service.json
// (which `make run` and the provisioning read), its migrations and
// migrations.<Name>(), a runbook stub, and its entries in the Makefile, the
// Dockerfile, compose, the postgres init scripts, Prometheus, the
// ServiceDown alert and the image workflow; its Kubernetes manifests
// (deploy/k8s/base/<name>.yaml) and its entries in both overlays (the gcp
// overlay's ServiceAccount and database Secret, and in its components
// (deploy/k8s/components) the certificate, TLS patch, PodMonitoring and
// operator-token store; the local overlay's database Secret); Terraform's
// topology.json (regenerated); and the connection budget the new
// Deployments change (docs/production.md, sql_max_connections). deploy/deploytest
// checks all of it against the declarations.
//
// Usage (from the repository root):
//
//	go run ./cmd/newservice -name shipping [-root .] [-skip-generate]
//
// It refuses a name that is not [a-z][a-z0-9-]*, is a Go keyword, or is
// taken, and never overwrites a file: everything is checked before anything
// is written.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "new-service:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("newservice", flag.ContinueOnError)
	name := fs.String("name", "", "the service's name: lowercase, [a-z][a-z0-9-]*, 6 to 30 characters (required)")
	root := fs.String("root", ".", "the repository root")
	skipGenerate := fs.Bool("skip-generate", false, "do not run buf generate for the new proto (run `make proto` yourself)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" {
		return errors.New("NAME is required, e.g. make new-service NAME=shipping")
	}
	plan, err := NewPlan(*root, *name)
	if err != nil {
		return err
	}
	if err := plan.Apply(); err != nil {
		return err
	}
	if !*skipGenerate {
		if err := generate(*root, plan.ProtoDir()); err != nil {
			return err
		}
	}
	if err := terraformTopology(*root); err != nil {
		return err
	}
	fmt.Print(plan.Summary())
	return nil
}

// terraformTopology regenerates deploy/terraform/gcp/topology.json from
// the declarations, the new one included (`make terraform-topology`):
// Terraform creates the service's account, Workload Identity binding,
// database, IAM database user, topic and subscriptions from it.
func terraformTopology(root string) error {
	cmd := exec.Command("go", "test", "-count=1", "-run", "^TestTerraformTopology$", "./internal/topology", "-update") //nolint:noctx // a one-shot CLI step
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make terraform-topology: %w\n%s", err, out)
	}
	return nil
}

// generate runs buf generate for the new proto only (offline: the plugins
// are Go tools pinned in tools/go.mod).
func generate(root, protoDir string) error {
	cmd := exec.Command("go", "tool", "-modfile=tools/go.mod", "buf", "generate", "--path", protoDir) //nolint:noctx // a one-shot CLI step
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("buf generate --path %s: %w\n%s", filepath.ToSlash(protoDir), err, out)
	}
	return nil
}
