package deploytest

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// egressDst is where a pod sends to: a pod (namespace, labels) or an
// address outside the cluster, on a port and protocol.
type egressDst struct {
	what      string
	namespace string
	labels    labels.Set
	ip        string // set: an address, not a pod
	port      int
	proto     corev1.Protocol
}

// sends evaluates NetworkPolicy egress semantics: a pod selected by no
// Egress policy sends anywhere; a selected one only where a rule of a
// selecting policy allows.
func sends(t *testing.T, pols []*networkingv1.NetworkPolicy, src netPod, dst egressDst) bool {
	t.Helper()
	isolated := false
	for _, p := range pols {
		if !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || !selects(t, &p.Spec.PodSelector, src.labels) {
			continue
		}
		isolated = true
		for _, rule := range p.Spec.Egress {
			if egressRuleAllows(t, rule, dst) {
				return true
			}
		}
	}
	return !isolated
}

func egressRuleAllows(t *testing.T, rule networkingv1.NetworkPolicyEgressRule, dst egressDst) bool {
	t.Helper()
	portOK := len(rule.Ports) == 0
	for _, p := range rule.Ports {
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if proto == dst.proto && (p.Port == nil || p.Port.IntValue() == dst.port) {
			portOK = true
		}
	}
	if !portOK {
		return false
	}
	if len(rule.To) == 0 {
		return true
	}
	for _, peer := range rule.To {
		switch {
		case peer.IPBlock != nil:
			if dst.ip == "" {
				continue // pods' addresses are not modelled: a block admits addresses only
			}
			pfx, err := netip.ParsePrefix(peer.IPBlock.CIDR)
			if err != nil {
				t.Fatalf("ipBlock %q: %v", peer.IPBlock.CIDR, err)
			}
			if pfx.Contains(netip.MustParseAddr(dst.ip)) {
				return true
			}
		case dst.ip != "":
			continue
		case peer.NamespaceSelector != nil:
			ns := labels.Set{"kubernetes.io/metadata.name": dst.namespace}
			if selects(t, peer.NamespaceSelector, ns) && selects(t, peer.PodSelector, dst.labels) {
				return true
			}
		case dst.namespace == k8sNamespace && selects(t, peer.PodSelector, dst.labels):
			return true
		}
	}
	return false
}

// TestK8sEgressIsDeniedButForWhatEachPodNeeds: in each overlay egress is
// denied by default and every pod has an egress policy; every pod resolves
// names (kube-dns); the services reach exactly the services they call
// (workorder the provider, the console every service); the local overlay's
// pods reach its PostgreSQL, Pub/Sub emulator and issuer, the GKE pods
// Google's APIs, Cloud SQL's proxy port and the metadata server; nothing
// reaches an arbitrary address.
func TestK8sEgressIsDeniedButForWhatEachPodNeeds(t *testing.T) {
	t.Parallel()
	pod := func(name string) egressDst {
		return egressDst{what: name, namespace: k8sNamespace, labels: labels.Set{labelName: name}, port: 9091, proto: corev1.ProtocolTCP}
	}
	addr := func(what, ip string, port int, proto corev1.Protocol) egressDst {
		return egressDst{what: what, ip: ip, port: port, proto: proto}
	}
	kubeDNS := egressDst{what: "kube-dns", namespace: "kube-system", labels: labels.Set{"k8s-app": "kube-dns"}, port: 53, proto: corev1.ProtocolUDP}
	calls := map[string][]string{"workorder": {"provider-sim"}, "console": {"workorder", "provider-sim", "billing"}}
	for _, o := range k8sOverlays {
		r := renderOverlay(t, o)
		pols := all[*networkingv1.NetworkPolicy](r)
		denyAll := false
		for _, p := range pols {
			if len(p.Spec.PodSelector.MatchLabels) == 0 && len(p.Spec.PodSelector.MatchExpressions) == 0 &&
				slices.Equal(p.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}) && len(p.Spec.Egress) == 0 {
				denyAll = true
			}
		}
		if !denyAll {
			t.Errorf("%s: no default-deny egress policy (podSelector {}, policyTypes [Egress], no rules)", o)
		}
		for _, src := range netPods(r) {
			if src.namespace != k8sNamespace {
				continue
			}
			want := map[string]bool{}
			check := func(dst egressDst, ok bool) {
				t.Helper()
				if got := sends(t, pols, src, dst); got != ok {
					t.Errorf("%s: %s -> %s:%d/%s allowed %v, want %v", o, src.what, dst.what, dst.port, dst.proto, got, ok)
				}
			}
			check(kubeDNS, true)
			check(addr("an arbitrary address", "203.0.113.7", 25, corev1.ProtocolTCP), false)
			svc := src.labels[labelName]
			lossless := src.labels["app.kubernetes.io/part-of"] == "lossless"
			for _, callee := range calls[svc] {
				want[callee] = true
			}
			for _, callee := range []string{"workorder", "provider-sim", "billing"} {
				if callee != svc {
					check(pod(callee), want[callee])
				}
			}
			switch o {
			case "local":
				for name, port := range map[string]int{"postgres": 5432, "pubsub-emulator": 8085, "localissuer": 8086} {
					dst := pod(name)
					dst.port = port
					check(dst, lossless)
				}
				check(addr("Google's APIs", "142.250.74.10", 443, corev1.ProtocolTCP), false)
			case "gcp":
				check(addr("Google's APIs", "142.250.74.10", 443, corev1.ProtocolTCP), lossless)
				check(addr("Cloud SQL's private IP", "10.60.0.3", 3307, corev1.ProtocolTCP), lossless)
				check(addr("the metadata server", "169.254.169.254", 80, corev1.ProtocolTCP), lossless)
				check(addr("GKE's metadata server", "169.254.169.252", 988, corev1.ProtocolTCP), lossless)
				check(addr("Cloud SQL on 5432", "10.60.0.3", 5432, corev1.ProtocolTCP), false)
			}
		}
	}
}
