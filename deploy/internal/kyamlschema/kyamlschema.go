// Package kyamlschema loads kustomize's built-in OpenAPI schema up front, for
// the deploy module's test binaries, which render kustomizations from
// parallel tests.
package kyamlschema

import (
	"sigs.k8s.io/kustomize/kyaml/openapi"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Load parses the schema. kyaml parses it on first use into package state
// that other calls read without its lock, so the first renders of parallel
// tests race (the race detector reports it). Called from TestMain, before
// any test starts, it leaves the schema only to be read.
func Load() {
	openapi.SchemaForResourceType(yaml.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"})
}
