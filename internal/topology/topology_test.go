package topology_test

import (
	"testing"

	"github.com/lossless-dev/lossless/internal/testkit/declaredtest"
	"github.com/lossless-dev/lossless/internal/topology"
)

// TestSystem_DeclaresEveryNameTheCodeUses: the declarations yield a valid
// topology holding every topic and subscription the services' code names,
// each consumer subscription with its dead-letter topic and inspection
// subscription.
func TestSystem_DeclaresEveryNameTheCodeUses(t *testing.T) {
	topo := declaredtest.Topology(t)
	if err := topo.Validate(); err != nil {
		t.Fatal(err)
	}
	topics := map[string]bool{}
	for _, tp := range topo.Topics {
		topics[tp.ID] = true
	}
	subs := map[string]string{} // id -> dead-letter topic
	for _, s := range topo.Subscriptions {
		subs[s.ID] = s.DeadLetterTopic
	}
	for _, tp := range []string{
		topology.TopicWorkOrderCompleted, topology.TopicWorkOrderEvents, topology.TopicBillingEvents,
		topology.TopicWorkOrderCompletedDeadLetter, topology.TopicWorkOrderEventsDeadLetter, topology.TopicBillingEventsDeadLetter,
	} {
		if !topics[tp] {
			t.Errorf("topic %q is not declared by any services/*/service.json", tp)
		}
	}
	for sub, dl := range map[string]string{
		topology.SubWorkOrderCompleted: topology.TopicWorkOrderCompletedDeadLetter,
		topology.SubWorkOrderEvents:    topology.TopicWorkOrderEventsDeadLetter,
		topology.SubBillingEvents:      topology.TopicBillingEventsDeadLetter,
	} {
		if got, ok := subs[sub]; !ok || got != dl {
			t.Errorf("subscription %q: declared %v, dead-letter topic %q; want declared with %q", sub, ok, got, dl)
		}
	}
	for _, sub := range []string{topology.SubWorkOrderCompletedDeadLetter, topology.SubWorkOrderEventsDeadLetter, topology.SubBillingEventsDeadLetter} {
		if _, ok := subs[sub]; !ok {
			t.Errorf("inspection subscription %q is not declared", sub)
		}
	}
}
