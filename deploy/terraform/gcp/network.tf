resource "google_compute_network" "main" {
  name                    = var.name_prefix
  auto_create_subnetworks = false

  depends_on = [google_project_service.api]
}

# Nodes have private IPs only; Private Google Access lets them pull from
# Artifact Registry and reach Google APIs (Pub/Sub, Cloud SQL Admin, Secret
# Manager, Trace, Monitoring) without a NAT. Images from outside Google (Docker
# Hub) would need a Cloud NAT on this subnet.
resource "google_compute_subnetwork" "gke" {
  name                     = "${var.name_prefix}-gke"
  region                   = var.region
  network                  = google_compute_network.main.id
  ip_cidr_range            = var.subnet_cidr
  private_ip_google_access = true

  secondary_ip_range {
    range_name    = "pods"
    ip_cidr_range = var.pods_cidr
  }
  secondary_ip_range {
    range_name    = "services"
    ip_cidr_range = var.services_cidr
  }
}

# Private services access: Cloud SQL gets an IP from this range, reachable
# from the VPC only (the instance has no public IP).
resource "google_compute_global_address" "sql" {
  name          = "${var.name_prefix}-sql-psa"
  purpose       = "VPC_PEERING"
  address_type  = "INTERNAL"
  prefix_length = 20
  network       = google_compute_network.main.id
}

resource "google_service_networking_connection" "sql" {
  network                 = google_compute_network.main.id
  service                 = "servicenetworking.googleapis.com"
  reserved_peering_ranges = [google_compute_global_address.sql.name]
}
