// Package deploytest validates the deployment files without Docker: the
// compose files (loaded with compose-go, as `docker compose config` would),
// the Dockerfile against the Makefile, the Prometheus alert rules (parsed by
// Prometheus's own rule parser), the Grafana provisioning and dashboard, and
// the metric contract deploy/compose/metrics.txt that ties them to the
// services. It has tests only.
package deploytest
