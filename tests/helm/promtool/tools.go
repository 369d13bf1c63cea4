//go:build tools

// Package promtool pins Prometheus for the tests: `go build` of
// github.com/prometheus/prometheus/cmd/promtool and .../cmd/prometheus in this module builds the
// version go.mod names. promtool checks and tests the PrometheusRule and the dashboard's queries
// the chart renders (tests/helm); the server scrapes the chart's own pods on a real node and
// evaluates the dashboard and the alerts there (tests/realchart).
package promtool

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
