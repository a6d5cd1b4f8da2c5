# The callers' identities besides the services' own accounts (iam.tf): the
# client accounts of AUTH_CLIENTS. A client mints Google ID tokens for a
# service's audience as that account (gcloud auth print-identity-token
# --impersonate-service-account, which needs roles/iam.serviceAccountOpenIdTokenCreator
# on it; docs/deploy-gcp.md), or the demo Job through Workload Identity
# (below). The account has no other role.
resource "google_service_account" "client" {
  for_each = var.clients

  account_id   = "${var.name_prefix}-${each.key}"
  display_name = "${each.key} client of ${var.name_prefix}"

  depends_on = [google_project_service.api]
}

locals {
  # The audience each service verifies (its AUTH_AUDIENCE) and its callers
  # mint tokens for: its own URL-like name, so a token minted for one
  # service is refused by every other.
  audiences = { for name, s in local.services : name => "https://${name}.${var.namespace}.svc" }
}

# The in-cluster demo (deploy/k8s/demo, make demo-gcp): the Kubernetes
# ServiceAccount demo in var.namespace acts as the demo client account, so
# its Job mints ID tokens from the metadata server, with no key and nobody's
# credentials. Only when var.clients has a demo.
resource "google_service_account_iam_member" "demo_workload_identity" {
  for_each = { for name, customers in var.clients : name => customers if name == "demo" }

  service_account_id = google_service_account.client[each.key].name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.namespace}/demo]"

  depends_on = [google_container_cluster.main]
}
