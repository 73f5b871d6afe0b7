// Package deploy holds fencegate's deployment examples, not Go code: a
// kustomize base and overlays running fencegate as a Kubernetes native
// sidecar (kubernetes/), Prometheus alerting
// rules (prometheus/) and a Grafana dashboard (grafana/). Its tests check
// them, with the Dockerfile, .dockerignore and docker-compose.yml at the
// repository root, against the real binary: the binary built with the
// Dockerfile's own build command, the configuration each example sets
// loaded by fencegate's config package, and every metric name the rules and
// dashboard query found in a real /metrics scrape.
package deploy
