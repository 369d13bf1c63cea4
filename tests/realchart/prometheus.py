"""A real Prometheus scraping the chart's own pods on the real node, configured as the Prometheus
Operator configures it from the chart's PodMonitors and PrometheusRule (the cluster has no
operator: each PodMonitor becomes the scrape job the operator would generate, with Kubernetes
pod discovery through the API server), so that the dashboard's queries and the alerts are
evaluated on what the real components export.

The server is built from the module tests/helm/promtool pins, and listens on loopback.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_gateway.devkit.realcluster import ControlPlane

JSON = dict[str, Any]
SCRAPE_INTERVAL = "2s"


def _label_name(label: str) -> str:
    """A pod label as Kubernetes discovery names it (__meta_kubernetes_pod_label_<name>)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def scrape_job(monitor: Mapping[str, Any], plane: ControlPlane, token_file: Path) -> JSON:
    """The scrape job the Prometheus Operator generates for a PodMonitor with one endpoint:
    Running pods of its namespace whose labels match its selector, on the container port of
    the endpoint's name, with the endpoint's path and relabelings."""
    meta, spec = monitor["metadata"], monitor["spec"]
    [endpoint] = spec["podMetricsEndpoints"]
    keep = [{"source_labels": [f"__meta_kubernetes_pod_label_{_label_name(key)}"],
             "regex": re.escape(str(value)), "action": "keep"}
            for key, value in sorted(spec["selector"]["matchLabels"].items())]
    keep += [
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"],
         "regex": re.escape(endpoint["port"]), "action": "keep"},
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)",
         "action": "drop"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    keep += [{"source_labels": r["sourceLabels"], "target_label": r["targetLabel"]}
             for r in endpoint.get("relabelings") or ()]
    return {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/0",
        "scrape_interval": SCRAPE_INTERVAL,
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [{
            "role": "pod", "api_server": plane.server,
            "tls_config": {"ca_file": str(plane.ca_file)},
            "authorization": {"credentials_file": str(token_file)},
            "namespaces": {"names": [meta["namespace"]]},
        }],
        "relabel_configs": keep,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Prometheus:
    """A Prometheus server scraping `jobs` and evaluating `rule_groups`."""

    binary: Path
    work: Path
    jobs: Sequence[JSON]
    rule_groups: Sequence[JSON]
    port: int = field(default_factory=_free_port)
    _process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.work / "prometheus.log"

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        rules = self.work / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": list(self.rule_groups)}))
        config = self.work / "prometheus.yaml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": SCRAPE_INTERVAL,
                       "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": [str(rules)], "scrape_configs": list(self.jobs)}))
        with self.log.open("wb") as log:
            self._process = subprocess.Popen([
                str(self.binary), f"--config.file={config}",
                f"--storage.tsdb.path={self.work / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log,
                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            self.check()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready",
                                            timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus not ready in 60 s:\n{self.tail()}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def check(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise AssertionError(f"Prometheus exited ({self._process.returncode}):\n"
                                 f"{self.tail()}")

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]) \
            if self.log.exists() else ""

    def api(self, path: str, **query: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[JSON]:
        """The instant vector (or scalar) `expr` evaluates to now."""
        data = self.api("query", query=expr)
        result = data["result"]
        return list(result) if data["resultType"] == "vector" else [{"value": result}]

    def targets(self) -> list[JSON]:
        return list(self.api("targets", state="active")["activeTargets"])

    def rules(self) -> list[JSON]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]
