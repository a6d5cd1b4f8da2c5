# The callers' identities besides the services' own accounts (iam.tf): the
# client accounts of AUTH_CLIENTS. A client mints Google ID tokens for a
# service's audience as that account (gcloud auth print-identity-token
# --impersonate-service-account, which needs roles/iam.serviceAccountOpenIdTokenCreator
# on it; docs/deploy-gcp.md). The account has no other role.
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
