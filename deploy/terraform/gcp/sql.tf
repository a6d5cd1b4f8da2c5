# One PostgreSQL 15 instance, one database per service that declares one
# (services/*/service.json "database"), each service logging in as its own Google service account
# (IAM database authentication: no password exists anywhere).
resource "google_sql_database_instance" "main" {
  name                = "${var.name_prefix}-pg"
  database_version    = "POSTGRES_15"
  region              = var.region
  deletion_protection = var.deletion_protection

  settings {
    tier                        = var.sql_tier
    edition                     = "ENTERPRISE"
    availability_type           = var.sql_availability_type
    deletion_protection_enabled = var.deletion_protection
    disk_autoresize             = true

    ip_configuration {
      ipv4_enabled    = false
      private_network = google_compute_network.main.id
      ssl_mode        = "ENCRYPTED_ONLY"
    }

    backup_configuration {
      enabled                        = true
      start_time                     = "02:00"
      point_in_time_recovery_enabled = true
      transaction_log_retention_days = var.sql_pitr_days
      backup_retention_settings {
        retained_backups = var.sql_backup_retained_count
        retention_unit   = "COUNT"
      }
    }

    database_flags {
      name  = "cloudsql.iam_authentication"
      value = "on"
    }
    # See variables.tf: pool size × replicas, summed over the services.
    database_flags {
      name  = "max_connections"
      value = var.sql_max_connections
    }

    maintenance_window {
      day          = 7
      hour         = 3
      update_track = "stable"
    }

    insights_config {
      query_insights_enabled = true
    }
  }

  depends_on = [google_service_networking_connection.sql]
}

resource "google_sql_database" "service" {
  for_each = local.databases

  name     = each.value.database
  instance = google_sql_database_instance.main.name

  # A database owned by a service's user cannot be dropped through the API
  # (Cloud SQL drops only databases of cloudsqlsuperuser): leave it to the
  # instance's deletion, so `terraform destroy` finishes.
  deletion_policy = "ABANDON"
}

# The IAM user of a service account is its email without
# ".gserviceaccount.com". The service's own user is the runtime role: it owns
# nothing, and its migrate user (migrate.tf), which README.md ("Database
# ownership") makes the database's owner, grants it what it may do.
resource "google_sql_user" "service" {
  for_each = local.databases

  name     = trimsuffix(google_service_account.service[each.key].email, ".gserviceaccount.com")
  instance = google_sql_database_instance.main.name
  type     = "CLOUD_IAM_SERVICE_ACCOUNT"

  # A user that owns a database (or any object) cannot be dropped; it goes
  # with the instance. Without this, `terraform destroy` stops on it.
  deletion_policy = "ABANDON"
}
