# One Google service account per service (services/*/service.json), with
# only what the service calls:
#   - Cloud SQL, for a service with a database: connect (cloudsql.client)
#     and log in as its IAM user (cloudsql.instanceUser), on this instance only;
#   - Pub/Sub: publish on the topics it publishes, pull/ack on its own
#     subscriptions (consumer and dead-letter inspection: the dead-letter
#     monitor and `workorder dead-letters replay --consumer inbox` pull there; replay
#     re-enters messages through the inbox, it publishes nothing). The client
#     never reads topic or subscription metadata, so no viewer role;
#   - telemetry: trace export and metric writes.
# It has no Pub/Sub admin right: Terraform owns the topology on GCP, a
# service's `provision` command is for the emulator (or an operator's
# credentials, where it reports no change).

# Named after the service, without name_prefix: <service>@<project>.iam.gserviceaccount.com
# is what deploy/k8s/overlays/gcp annotates each Kubernetes ServiceAccount
# with, and <service>@<project>.iam its Cloud SQL user. One deployment per
# project, as the Pub/Sub topic names (unprefixed) already require. An
# account id has 6 to 30 characters: a service with a shorter name needs a
# prefix here and in the overlay's service-accounts.yaml.
resource "google_service_account" "service" {
  for_each = local.services

  account_id   = each.key
  display_name = "${each.key} service"

  # The IAM API of a fresh project is enabled in the same apply: without
  # this the account can be created before it is on, and the apply fails.
  depends_on = [google_project_service.api]
}

locals {
  sql_instance_condition = "resource.type == \"sqladmin.googleapis.com/Instance\" && resource.name == \"projects/${var.project_id}/instances/${google_sql_database_instance.main.name}\""
}

# Project IAM members go through the Cloud Resource Manager API, enabled in
# the same apply: they wait for it through their account's depends_on.
resource "google_project_iam_member" "cloudsql_client" {
  for_each = local.databases

  project = var.project_id
  role    = "roles/cloudsql.client"
  member  = google_service_account.service[each.key].member

  condition {
    title      = "${var.name_prefix}-pg only"
    expression = local.sql_instance_condition
  }
}

resource "google_project_iam_member" "cloudsql_instance_user" {
  for_each = local.databases

  project = var.project_id
  role    = "roles/cloudsql.instanceUser"
  member  = google_service_account.service[each.key].member

  condition {
    title      = "${var.name_prefix}-pg only"
    expression = local.sql_instance_condition
  }
}

resource "google_project_iam_member" "trace_agent" {
  for_each = local.services

  project = var.project_id
  role    = "roles/cloudtrace.agent"
  member  = google_service_account.service[each.key].member
}

resource "google_project_iam_member" "metric_writer" {
  for_each = local.services

  project = var.project_id
  role    = "roles/monitoring.metricWriter"
  member  = google_service_account.service[each.key].member
}

resource "google_pubsub_topic_iam_member" "publisher" {
  for_each = local.published_topics

  topic  = google_pubsub_topic.this[each.key].name
  role   = "roles/pubsub.publisher"
  member = google_service_account.service[each.value.publisher].member
}

resource "google_pubsub_subscription_iam_member" "consumer" {
  for_each = local.subscriptions

  subscription = google_pubsub_subscription.this[each.key].name
  role         = "roles/pubsub.subscriber"
  member       = google_service_account.service[each.value.consumer].member
}

# Workload Identity: the Kubernetes ServiceAccount named after the service,
# in var.namespace, acts as the service's Google service account. The pool
# exists once the cluster does.
resource "google_service_account_iam_member" "workload_identity" {
  for_each = local.services

  service_account_id = google_service_account.service[each.key].name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.namespace}/${each.key}]"

  depends_on = [google_container_cluster.main]
}

# The database-ownership Job (deploy/cmd/gcpdeploy, `make deploy-gcp`): its
# Cloud SQL Auth Proxy connects as this account, which may only connect to
# the instance; in the database it logs in as the built-in postgres user
# (password set for the Job and discarded after it), not as an IAM user, so
# the account holds no instanceUser role and no database privilege.
resource "google_service_account" "db_owner" {
  account_id   = "${var.name_prefix}-db-owner"
  display_name = "Database-ownership Job of ${var.name_prefix}"

  depends_on = [google_project_service.api]
}

resource "google_project_iam_member" "db_owner_cloudsql_client" {
  project = var.project_id
  role    = "roles/cloudsql.client"
  member  = google_service_account.db_owner.member

  condition {
    title      = "${var.name_prefix}-pg only"
    expression = local.sql_instance_condition
  }
}

resource "google_service_account_iam_member" "db_owner_workload_identity" {
  service_account_id = google_service_account.db_owner.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.namespace}/db-owner]"

  depends_on = [google_container_cluster.main]
}
