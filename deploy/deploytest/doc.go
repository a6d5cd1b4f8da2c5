// Package deploytest validates the deployment files without Docker: the
// compose files (loaded with compose-go, as `docker compose config` would),
// the Dockerfile against the Makefile, the Prometheus alert rules (parsed by
// Prometheus's own rule parser), the Grafana provisioning and dashboard, and
// the metric contract deploy/compose/metrics.txt that ties them to the
// services. It has tests only.
//
// deploy/ is a module of its own (deploy/go.mod) so that compose-go and
// Prometheus, which only these tests need, stay out of the main module's
// go.mod; it imports nothing from the main module, and finds the repository
// and its module path through the two go.mod files.
package deploytest
