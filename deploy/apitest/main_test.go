package apitest

import (
	"os"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/openapi"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// TestMain parses kustomize's built-in OpenAPI schema before any test runs.
// kyaml parses it on first use into package state that other calls read
// without its lock, so the first renders of parallel tests race (the race
// detector reports it); parsed once up front, it is only read.
func TestMain(m *testing.M) {
	openapi.SchemaForResourceType(yaml.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"})
	os.Exit(m.Run())
}
