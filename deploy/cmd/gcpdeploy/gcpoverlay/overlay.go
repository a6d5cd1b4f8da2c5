package gcpoverlay

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// settingsHeader heads the settings.yaml Render writes.
const settingsHeader = `# Written by deploy/cmd/gcpdeploy from ` + "`terraform output -json`" + ` of deploy/terraform/gcp
# (output k8s_gcp_settings); kustomization.yaml copies these values into the
# manifests. Never applied to the cluster (local-config).
`

// Render writes the overlay in dir (a copy of deploy/k8s/overlays/gcp, next
// to its base) for the outputs: settings.yaml from k8s_gcp_settings, and in
// kustomization.yaml the namespace (output namespace: Workload Identity binds
// <namespace>/<service>) and every image under the output registry_url with
// the tag. The kustomization's comments stay.
func Render(dir string, o Outputs, tag string) error {
	if tag == "" {
		return fmt.Errorf("render: empty image tag")
	}
	settings := yaml.MustParse(`apiVersion: v1
kind: ConfigMap
metadata:
  name: gcp-settings
  annotations:
    config.kubernetes.io/local-config: "true"
data: {}
`)
	data := map[string]string{}
	for _, k := range SettingsKeys {
		data[k] = o.Settings[k]
	}
	settings.SetDataMap(data)
	s, err := settings.String()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "settings.yaml"), []byte(settingsHeader+s), 0o644); err != nil {
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
