# The migration identity of each service with a database (docs/adr/0020):
# its `migrate` Job logs in as <service>-migrate, which owns the database and
# its objects (the ownership Job of deploy/cmd/gcpdeploy hands them over) and
# grants the service's own user (sql.tf, the runtime role) read-write on the
# tables and INSERT/SELECT only on the append-only audit tables. The service
# itself owns nothing, so it cannot alter or empty an audit table.
#
# Named as the services' accounts are (iam.tf), without name_prefix:
# <service>-migrate@<project>.iam.gserviceaccount.com is what the overlay's
# service-accounts.yaml annotates the Kubernetes ServiceAccount <service>-migrate
# with, and <service>-migrate@<project>.iam the DATABASE_URL user of the
# service's migrate Job. An account id has at most 30 characters: a service
# with a database has a name of at most 22.
resource "google_service_account" "migrate" {
  for_each = local.databases

  account_id   = "${each.key}-migrate"
  display_name = "${each.key} migrations"

  depends_on = [google_project_service.api]
}

resource "google_project_iam_member" "migrate_cloudsql_client" {
  for_each = local.databases

  project = var.project_id
  role    = "roles/cloudsql.client"
  member  = google_service_account.migrate[each.key].member

  condition {
    title      = "${var.name_prefix}-pg only"
    expression = local.sql_instance_condition
  }
}

resource "google_project_iam_member" "migrate_cloudsql_instance_user" {
  for_each = local.databases

  project = var.project_id
  role    = "roles/cloudsql.instanceUser"
  member  = google_service_account.migrate[each.key].member

  condition {
    title      = "${var.name_prefix}-pg only"
    expression = local.sql_instance_condition
  }
}

resource "google_service_account_iam_member" "migrate_workload_identity" {
  for_each = local.databases

  service_account_id = google_service_account.migrate[each.key].name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.namespace}/${each.key}-migrate]"

  depends_on = [google_container_cluster.main]
}

# Owns the service's database once the ownership Job ran: as google_sql_user.service,
# it goes with the instance.
resource "google_sql_user" "migrate" {
  for_each = local.databases

  name     = trimsuffix(google_service_account.migrate[each.key].email, ".gserviceaccount.com")
  instance = google_sql_database_instance.main.name
  type     = "CLOUD_IAM_SERVICE_ACCOUNT"

  deletion_policy = "ABANDON"
}
