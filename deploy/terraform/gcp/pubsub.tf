# Every topic and subscription comes from topology.json (locals.tf), with the
# settings pubsub.Provision sends for the same declaration: running a
# service's `provision` command against the project after an apply changes
# nothing.

resource "google_pubsub_topic" "this" {
  for_each = local.topics

  name = each.key
  # Set on dead-letter topics only (kept as incident evidence); null: none.
  message_retention_duration = each.value.message_retention_duration

  depends_on = [google_project_service.api]
}

resource "google_pubsub_subscription" "this" {
  for_each = local.subscriptions

  name                       = each.key
  topic                      = google_pubsub_topic.this[each.value.topic].id
  ack_deadline_seconds       = each.value.ack_deadline_seconds
  message_retention_duration = each.value.message_retention_duration
  enable_message_ordering    = each.value.enable_message_ordering

  # ttl "": never expire, even after 31 days without a subscriber.
  expiration_policy {
    ttl = each.value.expiration_ttl
  }

  dynamic "retry_policy" {
    for_each = each.value.retry_policy == null ? [] : [each.value.retry_policy]
    content {
      minimum_backoff = retry_policy.value.minimum_backoff
      maximum_backoff = retry_policy.value.maximum_backoff
    }
  }

  dynamic "dead_letter_policy" {
    for_each = each.value.dead_letter_policy == null ? [] : [each.value.dead_letter_policy]
    content {
      dead_letter_topic     = google_pubsub_topic.this[dead_letter_policy.value.dead_letter_topic].id
      max_delivery_attempts = dead_letter_policy.value.max_delivery_attempts
    }
  }
}

# Dead-lettering on GCP: the Pub/Sub service agent forwards a message after
# max_delivery_attempts, so it must publish to the dead-letter topic and
# subscribe (acknowledge) on the source subscription. Without these grants
# messages are redelivered for ever instead of dead-lettered.
#
# The agent is created lazily by Google, often after the first topic exists:
# on an empty project a grant naming it by its address fails with "service
# account does not exist". Creating it here (generateServiceIdentity) makes
# the grants wait for it, so the first apply succeeds.
resource "google_project_service_identity" "pubsub" {
  provider = google-beta

  project = var.project_id
  service = "pubsub.googleapis.com"

  depends_on = [google_project_service.api]
}

locals {
  pubsub_service_agent = google_project_service_identity.pubsub.member
}

resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  for_each = local.dead_letter_topics

  topic  = google_pubsub_topic.this[each.key].name
  role   = "roles/pubsub.publisher"
  member = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  for_each = local.dead_lettering_subscriptions

  subscription = google_pubsub_subscription.this[each.key].name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}
