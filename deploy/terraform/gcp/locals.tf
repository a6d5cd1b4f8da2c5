# The Pub/Sub topology and the services, generated from services/*/service.json
# by `go test ./internal/topology -run TestTerraformTopology -update`: the same
# declarations `provision` creates the topology from, so the two cannot differ
# (that test fails when this file is stale). Never write a topic or a
# subscription name in a .tf file: add it to a service.json and regenerate.
locals {
  topology = jsondecode(file("${path.module}/topology.json"))

  services         = { for s in local.topology.services : s.name => s }
  databases        = { for s in local.topology.services : s.name => s if s.database != null }
  operator_tokens  = { for t in local.topology.operator_tokens : t.env => t }
  topics           = { for t in local.topology.topics : t.id => t }
  published_topics = { for t in local.topology.topics : t.id => t if t.publisher != null }
  subscriptions    = { for s in local.topology.subscriptions : s.id => s }
  # Subscriptions that dead-letter (the consumer subscriptions) and the topics
  # they dead-letter to: the Pub/Sub service agent needs rights on both.
  dead_lettering_subscriptions = { for s in local.topology.subscriptions : s.id => s if s.dead_letter_policy != null }
  dead_letter_topics           = { for s in local.topology.subscriptions : s.dead_letter_policy.dead_letter_topic => s.id if s.dead_letter_policy != null }
}
