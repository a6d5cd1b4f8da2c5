package deploytest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// k8sOverlays are the kustomize overlays under deploy/k8s/overlays.
var k8sOverlays = []string{"local", "gcp"}

// Labels the manifests use to tell services and roles apart.
const (
	labelName      = "app.kubernetes.io/name"
	labelComponent = "app.kubernetes.io/component"
	labelPartOf    = "app.kubernetes.io/part-of"
)

// podMonitoring is the part of a Managed Service for Prometheus PodMonitoring
// (monitoring.googleapis.com/v1) the manifests use.
type podMonitoring struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     intstr.IntOrString `json:"port"`
			Scheme   string             `json:"scheme"`
			Path     string             `json:"path"`
			Interval string             `json:"interval"`
			TLS      *struct {
				InsecureSkipVerify bool `json:"insecureSkipVerify"`
			} `json:"tls"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// gmpRules is a Rules object (monitoring.googleapis.com/v1).
type gmpRules struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Groups []struct {
			Name     string `json:"name"`
			Interval string `json:"interval"`
			Rules    []struct {
				Alert       string            `json:"alert"`
				Record      string            `json:"record"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// secretStore is an External Secrets SecretStore for Secret Manager. Auth
// nil: the store reads with the controller's own identity.
type secretStore struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Provider struct {
			GCPSM struct {
				ProjectID string `json:"projectID"`
				Auth      *struct {
					WorkloadIdentity *struct {
						ServiceAccountRef struct {
							Name string `json:"name"`
						} `json:"serviceAccountRef"`
						ClusterLocation  string `json:"clusterLocation"`
						ClusterName      string `json:"clusterName"`
						ClusterProjectID string `json:"clusterProjectID"`
					} `json:"workloadIdentity"`
				} `json:"auth"`
			} `json:"gcpsm"`
		} `json:"provider"`
	} `json:"spec"`
}

// storeRef names a SecretStore.
type storeRef struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
}

// externalSecret is an External Secrets ExternalSecret.
type externalSecret struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		RefreshInterval string   `json:"refreshInterval"`
		SecretStoreRef  storeRef `json:"secretStoreRef"`
		Target          struct {
			Name           string `json:"name"`
			CreationPolicy string `json:"creationPolicy"`
		} `json:"target"`
		Data []struct {
			SecretKey string `json:"secretKey"`
			RemoteRef struct {
				Key string `json:"key"`
			} `json:"remoteRef"`
			// SourceRef overrides the store for this key.
			SourceRef *struct {
				StoreRef storeRef `json:"storeRef"`
			} `json:"sourceRef"`
		} `json:"data"`
	} `json:"spec"`
}

// certIssuer is a cert-manager Issuer: self-signed, or a CA whose key pair
// is a Secret.
type certIssuer struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		SelfSigned *struct{} `json:"selfSigned"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca"`
	} `json:"spec"`
}

// certificate is a cert-manager Certificate.
type certificate struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		IsCA        bool     `json:"isCA"`
		CommonName  string   `json:"commonName"`
		SecretName  string   `json:"secretName"`
		Duration    string   `json:"duration"`
		RenewBefore string   `json:"renewBefore"`
		Usages      []string `json:"usages"`
		DNSNames    []string `json:"dnsNames"`
		IPAddresses []string `json:"ipAddresses"`
		PrivateKey  struct {
			Algorithm      string `json:"algorithm"`
			Size           int    `json:"size"`
			RotationPolicy string `json:"rotationPolicy"`
		} `json:"privateKey"`
		IssuerRef struct {
			Name string `json:"name"`
			Kind string `json:"kind"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// k8sKinds maps apiVersion/kind to the type an object must decode into,
// unknown fields refused. A kind not listed fails the render.
var k8sKinds = map[string]func() any{
	"v1/Namespace":                               func() any { return new(corev1.Namespace) },
	"v1/ConfigMap":                               func() any { return new(corev1.ConfigMap) },
	"v1/Secret":                                  func() any { return new(corev1.Secret) },
	"v1/Service":                                 func() any { return new(corev1.Service) },
	"v1/ServiceAccount":                          func() any { return new(corev1.ServiceAccount) },
	"apps/v1/Deployment":                         func() any { return new(appsv1.Deployment) },
	"apps/v1/StatefulSet":                        func() any { return new(appsv1.StatefulSet) },
	"batch/v1/Job":                               func() any { return new(batchv1.Job) },
	"policy/v1/PodDisruptionBudget":              func() any { return new(policyv1.PodDisruptionBudget) },
	"networking.k8s.io/v1/NetworkPolicy":         func() any { return new(networkingv1.NetworkPolicy) },
	"autoscaling/v2/HorizontalPodAutoscaler":     func() any { return new(autoscalingv2.HorizontalPodAutoscaler) },
	"monitoring.googleapis.com/v1/PodMonitoring": func() any { return new(podMonitoring) },
	"monitoring.googleapis.com/v1/Rules":         func() any { return new(gmpRules) },
	"external-secrets.io/v1/SecretStore":         func() any { return new(secretStore) },
	"external-secrets.io/v1/ExternalSecret":      func() any { return new(externalSecret) },
	"cert-manager.io/v1/Issuer":                  func() any { return new(certIssuer) },
	"cert-manager.io/v1/Certificate":             func() any { return new(certificate) },
}

// rendered is an overlay's output, decoded.
type rendered struct {
	overlay string
	objs    []any
}

// renderOverlay builds deploy/k8s/overlays/<name> as `kustomize build`
// would and decodes every object strictly into its API type.
func renderOverlay(t *testing.T, name string) rendered {
	t.Helper()
	return renderDir(t, name, overlayDir(t, name))
}

// renderDir renders the kustomization in dir, named name in failures.
func renderDir(t *testing.T, name, dir string) rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("overlay %s: kustomize build: %v", name, err)
	}
	r := rendered{overlay: name}
	for _, res := range m.Resources() {
		b, err := res.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		obj, err := decodeStrict(b)
		if err != nil {
			t.Errorf("overlay %s: %s %s: %v", name, res.GetKind(), res.GetName(), err)
			continue
		}
		r.objs = append(r.objs, obj)
	}
	if t.Failed() {
		t.FailNow()
	}
	return r
}

func decodeStrict(b []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := json.Unmarshal(b, &tm); err != nil {
		return nil, err
	}
	newObj, ok := k8sKinds[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("apiVersion %s kind %s: not a kind these checks know", tm.APIVersion, tm.Kind)
	}
	obj := newObj()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// all returns the objects of type T.
func all[T any](r rendered) []T {
	var out []T
	for _, o := range r.objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func deployments(r rendered) map[string]*appsv1.Deployment {
	m := map[string]*appsv1.Deployment{}
	for _, d := range all[*appsv1.Deployment](r) {
		m[d.Name] = d
	}
	return m
}

func configMaps(r rendered) map[string]*corev1.ConfigMap {
	m := map[string]*corev1.ConfigMap{}
	for _, c := range all[*corev1.ConfigMap](r) {
		m[c.Name] = c
	}
	return m
}

func secrets(r rendered) map[string]*corev1.Secret {
	m := map[string]*corev1.Secret{}
	for _, s := range all[*corev1.Secret](r) {
		m[s.Name] = s
	}
	return m
}

// secretValue reads key of a Secret from data or stringData.
func secretValue(s *corev1.Secret, key string) (string, bool) {
	if v, ok := s.StringData[key]; ok {
		return v, true
	}
	v, ok := s.Data[key]
	return string(v), ok
}

// workload is a pod template with where it comes from.
type workload struct {
	kind, name string
	pod        corev1.PodTemplateSpec
}

func (w workload) String() string { return w.kind + "/" + w.name }

// workloads returns every pod template of an overlay.
func workloads(r rendered) []workload {
	var out []workload
	for _, o := range r.objs {
		switch v := o.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{"Deployment", v.Name, v.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, workload{"StatefulSet", v.Name, v.Spec.Template})
		case *batchv1.Job:
			out = append(out, workload{"Job", v.Name, v.Spec.Template})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// appContainer returns the container running the service's binary: in a
// pod of the base (labelled part-of lossless), the one named after the
// service the pod is labelled with; nil in other pods.
func appContainer(w workload) *corev1.Container {
	if w.pod.Labels[labelPartOf] != "lossless" {
		return nil
	}
	svc := w.pod.Labels[labelName]
	for i := range w.pod.Spec.Containers {
		if c := &w.pod.Spec.Containers[i]; c.Name == svc && svc != "" {
			return c
		}
	}
	return nil
}

// serveRole returns the role of a `serve --role=X` container, "all" for a
// plain `serve` (a service without roles), "" for other commands.
func serveRole(c *corev1.Container) string {
	switch {
	case c == nil || len(c.Args) == 0 || c.Args[0] != "serve":
		return ""
	case len(c.Args) == 1:
		return "all"
	case len(c.Args) == 2:
		role, _ := strings.CutPrefix(c.Args[1], "--role=")
		return role
	}
	return ""
}

func allContainers(p corev1.PodSpec) []corev1.Container {
	return append(append([]corev1.Container(nil), p.InitContainers...), p.Containers...)
}

// containerPort resolves a probe's port (name or number) on container c.
func containerPort(c *corev1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

// localSecretsDir is where deploy/k8s/overlays/local/generate-secrets.sh
// writes the secrets the local overlay's secretGenerator reads (git-ignored),
// relative to deploy/k8s.
const localSecretsDir = "overlays/local/secrets"

// overlayDir is the directory to build overlay name from: the repository's,
// or for the local overlay a copy of deploy/k8s whose secrets
// generate-secrets.sh has just written, as a developer runs it before
// applying.
func overlayDir(t *testing.T, name string) string {
	t.Helper()
	if name != "local" {
		return repoPath(t, "deploy/k8s/overlays/"+name)
	}
	dir := filepath.Join(copyK8sTree(t), "overlays", "local")
	cmd := exec.CommandContext(t.Context(), "sh", filepath.Join(dir, "generate-secrets.sh"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generate-secrets.sh: %v\n%s", err, out)
	}
	return dir
}
