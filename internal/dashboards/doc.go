// Package dashboards holds no code: its tests check the Grafana dashboard
// (deploy/grafana) and the Prometheus rules (deploy/prometheus) against the
// metrics a running kvgate exports.
package dashboards
