package gcpoverlay

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Components are the names (last path element) of the kustomize components
// the overlay in dir composes, in its kustomization's order.
func Components(dir string) ([]string, error) {
	_, paths, err := readComponents(dir)
	if err != nil {
		return nil, err
	}
	return componentNames(paths), nil
}

// componentNames are the last path elements of the components' paths.
func componentNames(paths []string) []string {
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = path.Base(p)
	}
	return names
}

// SelectComponents keeps in the overlay's `components:` only those named in
// keep, in their committed order: how a deploy goes without one (TLS,
// Managed Prometheus, External Secrets). A name the overlay does not compose
// is an error, naming the ones it does: a typo must not deploy without TLS.
// The kustomization's comments stay.
func SelectComponents(dir string, keep []string) error {
	k, paths, err := readComponents(dir)
	if err != nil {
		return err
	}
	have := componentNames(paths)
	for _, name := range keep {
		if !slices.Contains(have, name) {
			return fmt.Errorf("components: the overlay %s has no component %q (it has %s)", dir, name, strings.Join(have, ", "))
		}
	}
	seq, err := k.Pipe(yaml.Lookup("components"))
	if err != nil {
		return err
	}
	var kept []*yaml.Node
	for i, n := range seq.YNode().Content {
		if slices.Contains(keep, have[i]) {
			kept = append(kept, n)
		}
	}
	seq.YNode().Content = kept
	if len(kept) == 0 {
		seq.YNode().Style = yaml.FlowStyle // "components: []"
	}
	out, err := k.String()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(out), 0o644)
}

// componentDirs are the directories of the components the overlay in dir
// composes.
func componentDirs(dir string) ([]string, error) {
	_, paths, err := readComponents(dir)
	if err != nil {
		return nil, err
	}
	dirs := make([]string, len(paths))
	for i, p := range paths {
		dirs[i] = filepath.Join(dir, filepath.FromSlash(p))
	}
	return dirs, nil
}

// readComponents parses the overlay's kustomization and its `components:`
// paths (none when it has no such field).
func readComponents(dir string) (*yaml.RNode, []string, error) {
	kfile := filepath.Join(dir, "kustomization.yaml")
	k, err := yaml.ReadFile(kfile)
	if err != nil {
		return nil, nil, err
	}
	seq, err := k.Pipe(yaml.Lookup("components"))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: components: %w", kfile, err)
	}
	if seq == nil {
		return k, nil, nil
	}
	if seq.YNode().Kind != yaml.SequenceNode {
		return nil, nil, fmt.Errorf("%s: components is not a list of paths", kfile)
	}
	var out []string
	for _, n := range seq.YNode().Content {
		if n.Kind != yaml.ScalarNode || n.Value == "" {
			return nil, nil, fmt.Errorf("%s: components is not a list of paths", kfile)
		}
		out = append(out, n.Value)
	}
	return k, out, nil
}
