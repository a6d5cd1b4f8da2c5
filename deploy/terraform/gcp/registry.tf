# One Docker repository for the service images (deploy/docker/Dockerfile,
# one target per service): <region>-docker.pkg.dev/<project>/<name_prefix>/<service>.
resource "google_artifact_registry_repository" "images" {
  location      = var.region
  repository_id = var.name_prefix
  format        = "DOCKER"
  description   = "Service images"

  # Untagged images (superseded pushes) go after 30 days; tagged releases stay.
  cleanup_policies {
    id     = "delete-untagged"
    action = "DELETE"
    condition {
      tag_state  = "UNTAGGED"
      older_than = "2592000s"
    }
  }

  depends_on = [google_project_service.api]
}
