package deploytest

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
)

// The namespace the overlays deploy into.
const k8sNamespace = "lossless"

// netPod is a pod template of a rendered workload: a destination (its
// container ports) and a source of traffic.
type netPod struct {
	what      string
	namespace string
	labels    labels.Set
	ports     []corev1.ContainerPort
}

// outside is a client with no pod in the cluster's namespaces we know.
var outside = netPod{what: "a client outside the namespace", namespace: "elsewhere"}

// gmpCollector is Managed Service for Prometheus's scraper (GKE).
var gmpCollector = netPod{what: "the Managed Prometheus collector", namespace: "gmp-system",
	labels: labels.Set{"app.kubernetes.io/name": "collector"}}

func netPods(r rendered) []netPod {
	var out []netPod
	add := func(kind, name string, tpl corev1.PodTemplateSpec) {
		p := netPod{what: kind + " " + name, namespace: k8sNamespace, labels: labels.Set(tpl.Labels)}
		for _, c := range tpl.Spec.Containers {
			p.ports = append(p.ports, c.Ports...)
		}
		out = append(out, p)
	}
	for _, d := range all[*appsv1.Deployment](r) {
		add("Deployment", d.Name, d.Spec.Template)
	}
	for _, s := range all[*appsv1.StatefulSet](r) {
		add("StatefulSet", s.Name, s.Spec.Template)
	}
	for _, j := range all[*batchv1.Job](r) {
		add("Job", j.Name, j.Spec.Template)
	}
	return out
}

func selects(t *testing.T, sel *metav1.LabelSelector, l labels.Set) bool {
	t.Helper()
	if sel == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	return s.Matches(l)
}

// admits evaluates NetworkPolicy ingress semantics: a pod selected by no
// Ingress policy admits everything; a selected one admits what any rule of
// any selecting policy admits.
func admits(t *testing.T, pols []*networkingv1.NetworkPolicy, src, dst netPod, port corev1.ContainerPort) bool {
	t.Helper()
	isolated := false
	for _, p := range pols {
		if !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !selects(t, &p.Spec.PodSelector, dst.labels) {
			continue
		}
		isolated = true
		for _, rule := range p.Spec.Ingress {
			if ruleAdmits(t, rule, src, port) {
				return true
			}
		}
	}
	return !isolated
}

func ruleAdmits(t *testing.T, rule networkingv1.NetworkPolicyIngressRule, src netPod, port corev1.ContainerPort) bool {
	t.Helper()
	portOK := len(rule.Ports) == 0
	for _, p := range rule.Ports {
		if p.Port == nil || (p.Port.IntValue() == int(port.ContainerPort)) || (p.Port.StrVal != "" && p.Port.StrVal == port.Name) {
			portOK = true
		}
	}
	if !portOK {
		return false
	}
	if len(rule.From) == 0 {
		return true
	}
	for _, peer := range rule.From {
		switch {
		case peer.IPBlock != nil:
			t.Fatalf("ipBlock peers are not modelled here: %+v", peer.IPBlock)
		case peer.NamespaceSelector != nil:
			ns := labels.Set{"kubernetes.io/metadata.name": src.namespace}
			if selects(t, peer.NamespaceSelector, ns) && selects(t, peer.PodSelector, src.labels) {
				return true
			}
		case src.namespace == k8sNamespace && selects(t, peer.PodSelector, src.labels):
			return true
		}
	}
	return false
}

var callRef = regexp.MustCompile(`\{(grpc|http|admin_grpc|admin_http):([a-z0-9-]+)\}`)

// TestK8sNetworkPoliciesAdmitExactlyTheDeclaredPaths: in each overlay,
// ingress is denied by default, and for every pair of workloads (and a
// client outside the namespace) a port is reachable exactly when a
// service.json declares the path: "public" admits everyone to the service's
// public ports, {grpc:<s>}, {http:<s>}, {admin_grpc:<s>} or {admin_http:<s>}
// in a caller's local_env admits that caller to that port of s (the admin
// ports, ADR 0026, are never public). The local overlay's PostgreSQL and
// Pub/Sub emulator admit the namespace's pods only; on GKE, Managed
// Prometheus's collector reaches every service's admin-http port (/metrics).
func TestK8sNetworkPoliciesAdmitExactlyTheDeclaredPaths(t *testing.T) {
	t.Parallel()
	svcs := map[string]declaredService{}
	// calls[s][port name] = the services that call that port of s.
	calls := map[string]map[string][]string{}
	for _, s := range declaredServices(t) {
		svcs[s.Name] = s
		for _, v := range s.LocalEnv {
			for _, m := range callRef.FindAllStringSubmatch(v, -1) {
				if calls[m[2]] == nil {
					calls[m[2]] = map[string][]string{}
				}
				port := strings.ReplaceAll(m[1], "_", "-") // admin_grpc: the port named admin-grpc
				calls[m[2]][port] = append(calls[m[2]][port], s.Name)
			}
		}
	}
	for _, o := range k8sOverlays {
		r := renderOverlay(t, o)
		pols := all[*networkingv1.NetworkPolicy](r)
		denyAll := false
		for _, p := range pols {
			if len(p.Spec.PodSelector.MatchLabels)+len(p.Spec.PodSelector.MatchExpressions) == 0 &&
				slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) && len(p.Spec.Ingress) == 0 {
				denyAll = true
			}
		}
		if !denyAll {
			t.Errorf("%s: no default-deny ingress NetworkPolicy (empty podSelector, no rules)", o)
		}
		pods := netPods(r)
		sources := append([]netPod{outside, gmpCollector}, pods...)
		for _, dst := range pods {
			svc, ours := svcs[dst.labels[labelName]]
			for _, port := range dst.ports {
				for _, src := range sources {
					want := false
					switch {
					case !ours: // infrastructure of the local overlay
						want = src.namespace == k8sNamespace
					case o == "gcp" && src.what == gmpCollector.what && port.Name == "admin-http":
						want = true
					case svc.Public && !strings.HasPrefix(port.Name, "admin-"):
						want = true
					default:
						want = slices.Contains(calls[svc.Name][port.Name], src.labels[labelName])
					}
					if got := admits(t, pols, src, dst, port); got != want {
						t.Errorf("%s: %s -> %s port %s (%d): admitted %v, want %v", o, src.what, dst.what, port.Name, port.ContainerPort, got, want)
					}
				}
			}
		}
	}
}

// The evaluator itself: without the policies every path is open, so the
// check above would fail on a base without them.
func TestK8sNetworkPolicyEvaluator(t *testing.T) {
	t.Parallel()
	dst := netPod{what: "d", namespace: k8sNamespace, labels: labels.Set{labelName: "billing"}}
	port := corev1.ContainerPort{Name: "grpc", ContainerPort: 9092}
	if !admits(t, nil, outside, dst, port) {
		t.Fatal("no policy: every path is open")
	}
	deny := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if admits(t, []*networkingv1.NetworkPolicy{deny}, outside, dst, port) {
		t.Fatal("default deny admits")
	}
	console := netPod{what: "c", namespace: k8sNamespace, labels: labels.Set{labelName: "console"}}
	allow := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{labelName: "billing"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{labelName: "console"}}}},
		}},
	}}
	pols := []*networkingv1.NetworkPolicy{deny, allow}
	for _, c := range []struct {
		src  netPod
		want bool
	}{{console, true}, {outside, false}, {netPod{namespace: "elsewhere", labels: console.labels}, false}} {
		if got := admits(t, pols, c.src, dst, port); got != c.want {
			t.Errorf("%s: %v, want %v", fmt.Sprint(c.src), got, c.want)
		}
	}
}
