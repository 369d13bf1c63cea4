"""A cluster that is not one is said to be so: the commands that read a cluster for a person
check first that the endpoint serves the Kubernetes API (and DRA where they need it), and say
what they found instead, with exit code 1, rather than showing an empty cluster."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_gateway.cli import main

VERSION = {"major": "1", "minor": "33", "gitVersion": "v1.33.2"}
NO_DRA = {"kind": "APIGroupList", "groups": [
    {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}]}]}


def _server(answers: dict[str, object]) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers.get(self.path.split("?")[0])
            if body is None:
                self.send_response(404)
                self.end_headers()
                self.wfile.write(b"404 page not found\n")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def endpoint(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    server, url = _server(request.param)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    yield kubeconfig
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("endpoint", [{}], indirect=True)
@pytest.mark.parametrize("command", [["report"], ["defrag", "plan"], ["migrate", "plan"],
                                     ["migrate", "quotas"], ["migrate", "node", "gpu-1"]])
def test_a_server_that_is_not_kubernetes_is_said_so_with_exit_code_1(
        endpoint: Path, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--kubeconfig", str(endpoint)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert "does not serve the Kubernetes API: GET /version answered HTTP 404 '404 page not " \
           "found'; point --kubeconfig (or $KUBECONFIG) at a Kubernetes API server" in out.err
    assert len(out.err.splitlines()) == 1


@pytest.mark.parametrize("endpoint", [{"/version": VERSION, "/apis": NO_DRA}], indirect=True)
def test_a_kubernetes_without_dra_is_said_so_where_the_command_needs_it(
        endpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--kubeconfig", str(endpoint)]) == 1
    err = capsys.readouterr().err
    assert "(v1.33.2) does not serve resource.k8s.io/v1, which is DRA as the gateway uses it " \
           "(Kubernetes 1.34 or later)" in err


@pytest.mark.parametrize("endpoint", [{"/version": {"hello": "world"}}], indirect=True)
def test_json_that_is_no_kubernetes_version_is_not_taken_for_one(
        endpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", "plan", "--kubeconfig", str(endpoint)]) == 1
    assert "GET /version answered something other than a Kubernetes version: " \
           "'{\"hello\": \"world\"}'" in capsys.readouterr().err


@pytest.mark.parametrize("endpoint", [{"/version": VERSION, "/apis": ["not", "a", "list"]}],
                         indirect=True)
def test_an_api_group_list_that_is_no_object_is_no_crash(
        endpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--kubeconfig", str(endpoint)]) == 1
    assert "does not serve resource.k8s.io/v1" in capsys.readouterr().err


def test_a_kubernetes_that_refuses_the_credentials_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "message": "Unauthorized", "reason": "Unauthorized",
                               "code": 401}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "c", "cluster": {
                "server": f"http://127.0.0.1:{server.server_address[1]}"}}],
            "users": [{"name": "u", "user": {"token": "expired"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
        assert main(["report", "--kubeconfig", str(kubeconfig)]) == 1
        err = capsys.readouterr().err
        assert "Unauthorized" in err
        assert "does not serve the Kubernetes API" not in err
    finally:
        server.shutdown()
        server.server_close()
