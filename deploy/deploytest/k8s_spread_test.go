package deploytest

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
)

// spreadKeys are the topologies every replicated Deployment spreads over:
// nodes first, then zones (a regional GKE cluster has three).
var spreadKeys = []string{corev1.LabelHostname, corev1.LabelTopologyZone}

// TestK8sReplicatedDeploymentsSpreadAcrossNodesAndZones: every Deployment
// that runs more than one pod (replicas > 1, or scaled by an autoscaler)
// asks the scheduler to spread its own pods over nodes and zones, with
// maxSkew 1 and ScheduleAnyway: a preference, so a one-node kind cluster
// and nodes without a zone label still run every replica. Two replicas on
// one node would both go with it, which the disruption budget cannot stop.
func TestK8sReplicatedDeploymentsSpreadAcrossNodesAndZones(t *testing.T) {
	t.Parallel()
	for _, o := range k8sOverlays {
		r := renderOverlay(t, o)
		scaled := map[string]bool{}
		for _, h := range all[*autoscalingv2.HorizontalPodAutoscaler](r) {
			if h.Spec.ScaleTargetRef.Kind == "Deployment" {
				scaled[h.Spec.ScaleTargetRef.Name] = true
			}
		}
		replicated := 0
		for name, d := range deployments(r) {
			if !scaled[name] && (d.Spec.Replicas == nil || *d.Spec.Replicas <= 1) {
				continue
			}
			replicated++
			pods := labels.Set(d.Spec.Template.Labels)
			for _, key := range spreadKeys {
				i := slices.IndexFunc(d.Spec.Template.Spec.TopologySpreadConstraints, func(c corev1.TopologySpreadConstraint) bool {
					return c.TopologyKey == key
				})
				if i < 0 {
					t.Errorf("%s: Deployment %s runs several pods and has no topologySpreadConstraint over %s", o, name, key)
					continue
				}
				c := d.Spec.Template.Spec.TopologySpreadConstraints[i]
				if c.MaxSkew != 1 || c.WhenUnsatisfiable != corev1.ScheduleAnyway {
					t.Errorf("%s: Deployment %s: spread over %s has maxSkew %d, whenUnsatisfiable %s; want 1, ScheduleAnyway (a single-node cluster must still schedule)",
						o, name, key, c.MaxSkew, c.WhenUnsatisfiable)
				}
				sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
				if err != nil || c.LabelSelector == nil || sel.Empty() || !sel.Matches(pods) {
					t.Errorf("%s: Deployment %s: spread over %s selects %v, want its own pods (%v)", o, name, key, c.LabelSelector, pods)
					continue
				}
				// Selecting another Deployment's pods too would spread the
				// two together, not each over the nodes.
				for other, od := range deployments(r) {
					if other != name && sel.Matches(labels.Set(od.Spec.Template.Labels)) {
						t.Errorf("%s: Deployment %s: spread over %s also selects Deployment %s's pods", o, name, key, other)
					}
				}
			}
		}
		if replicated == 0 {
			t.Errorf("%s: no Deployment runs more than one pod; the check checks nothing", o)
		}
	}
}
