package gcpoverlay

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// settingsHeader heads the settings.yaml Render writes.
const settingsHeader = `# Written by deploy/cmd/gcpdeploy from ` + "`terraform output -json`" + ` of deploy/terraform/gcp
# (output k8s_gcp_settings); kustomization.yaml copies these values into the
# manifests. Never applied to the cluster (local-config).
`

// Render writes the overlay in dir (a copy of deploy/k8s/overlays/gcp, next
// to its base and the components; the components it composes are edited
// too, so copy the whole of deploy/k8s) for the outputs: settings.yaml from k8s_gcp_settings, which
// must have exactly the keys of the settings.yaml it replaces (each is a
// replacement's source in kustomization.yaml), and in
// kustomization.yaml the namespace (output namespace: Workload Identity binds
// <namespace>/<service>) and every image under the output registry_url with
// the tag. The kustomization's comments stay.
func Render(dir string, o Outputs, tag string) error {
	if tag == "" {
		return fmt.Errorf("render: empty image tag")
	}
	sfile := filepath.Join(dir, "settings.yaml")
	example, err := yaml.ReadFile(sfile)
	if err != nil {
		return fmt.Errorf("the overlay's settings: %w", err)
	}
	var problems []string
	for _, k := range slices.Sorted(maps.Keys(example.GetDataMap())) {
		if _, ok := o.Settings[k]; !ok {
			problems = append(problems, fmt.Sprintf("%s has %s, Terraform's output k8s_gcp_settings does not", sfile, k))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(o.Settings)) {
		if _, ok := example.GetDataMap()[k]; !ok {
			problems = append(problems, fmt.Sprintf("Terraform's output k8s_gcp_settings has %s, which %s does not use", k, sfile))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("render: %s", strings.Join(problems, "; "))
	}
	settings := yaml.MustParse(`apiVersion: v1
kind: ConfigMap
metadata:
  name: gcp-settings
  annotations:
    config.kubernetes.io/local-config: "true"
data: {}
`)
	settings.SetDataMap(o.Settings)
	s, err := settings.String()
	if err != nil {
		return err
	}
	if err := os.WriteFile(sfile, []byte(settingsHeader+s), 0o644); err != nil {
		return err
	}

	if err := renameServiceDomains(dir, o.Namespace); err != nil {
		return err
	}

	kfile := filepath.Join(dir, "kustomization.yaml")
	b, err := os.ReadFile(kfile)
	if err != nil {
		return err
	}
	k, err := yaml.Parse(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", kfile, err)
	}
	if err := k.PipeE(yaml.SetField("namespace", yaml.NewStringRNode(o.Namespace))); err != nil {
		return err
	}
	images, err := k.Pipe(yaml.Lookup("images"))
	if err != nil || images == nil {
		return fmt.Errorf("%s: no images list to point at the registry", kfile)
	}
	elems, err := images.Elements()
	if err != nil {
		return fmt.Errorf("%s: images: %w", kfile, err)
	}
	for _, img := range elems {
		name := yaml.GetValue(img.Field("name").Value)
		if name == "" {
			return fmt.Errorf("%s: an image without a name", kfile)
		}
		// lossless/<service> -> <registry_url>/<service>: deploy/docker/Dockerfile's
		// targets, pushed there by make deploy-gcp.
		newName := yaml.NewStringRNode(strings.TrimSuffix(o.RegistryURL, "/") + "/" + path.Base(name))
		newTag := yaml.NewStringRNode(tag)
		newTag.YNode().Style = yaml.DoubleQuotedStyle // a tag of digits stays a string
		if err := img.PipeE(yaml.SetField("newName", newName)); err != nil {
			return err
		}
		if err := img.PipeE(yaml.SetField("newTag", newTag)); err != nil {
			return err
		}
	}
	out, err := k.String()
	if err != nil {
		return err
	}
	return os.WriteFile(kfile, []byte(out), 0o644)
}

// committedDomain is the service DNS suffix of the committed namespace.
const committedDomain = ".lossless.svc"

// renameServiceDomains rewrites <service>.lossless.svc in the files of the
// overlay and of the components it composes (the certificates' DNS names,
// components/tls-cert-manager) to the output namespace's domain:
// kustomize's namespace field renames objects, not the names written inside
// their fields, and a certificate for the wrong domain fails every TLS
// handshake by name.
func renameServiceDomains(dir, namespace string) error {
	if namespace == "" {
		return fmt.Errorf("render: empty namespace")
	}
	components, err := componentDirs(dir)
	if err != nil {
		return err
	}
	for _, root := range append([]string{dir}, components...) {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || (filepath.Ext(p) != ".yaml" && filepath.Ext(p) != ".yml") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil || !strings.Contains(string(b), committedDomain) {
				return err
			}
			return os.WriteFile(p, []byte(strings.ReplaceAll(string(b), committedDomain, "."+namespace+".svc")), 0o644)
		})
		if err != nil {
			return err
		}
	}
	return nil
}
