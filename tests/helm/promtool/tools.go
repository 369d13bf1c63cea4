//go:build tools

// Package promtool pins Prometheus' promtool for the chart's tests: `go build
// github.com/prometheus/prometheus/cmd/promtool` in this module builds the version go.mod
// names, which `promtool check rules` and `promtool test rules` then run against the
// PrometheusRule the chart renders (tests/helm/test_monitoring.py).
package promtool

import _ "github.com/prometheus/prometheus/cmd/promtool"
