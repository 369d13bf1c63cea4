"""The development kit's REST client (`dra_gateway.devkit.realcluster.Api`) raises the cluster
port's `ApiError`, as every production client does: `code` the HTTP status, `reason` and
`message` from the Status the API server answered, `status` that Status. Served over HTTPS on
loopback, with a CA made for the test, as the real control plane's API server serves it."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dra_gateway.certs.generate import make_bundle, write_bundle
from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube.cluster.port import ApiError

MISSING = path_of("v1", "pods", namespace="x", name="missing")
NOT_FOUND = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
             "message": 'pods "missing" not found', "reason": "NotFound",
             "details": {"name": "missing", "kind": "pods"}, "code": 404}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == MISSING:
            self._answer(404, json.dumps(NOT_FOUND).encode(), "application/json")
        elif self.path == "/text":
            self._answer(500, b"upstream broke", "text/plain")
        elif self.path == "/empty":
            self._answer(403, b"", "text/plain")
        else:
            self._answer(200, b'{"kind": "Namespace"}', "application/json")

    def _answer(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    paths = write_bundle(make_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"]),
                         tmp_path / "pki")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths.cert, paths.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Api(f"https://127.0.0.1:{server.server_address[1]}", "token", paths.ca_cert,
                  timeout_s=10)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_error_status_is_the_ports_api_error_with_the_http_code_and_the_status(
        api: Api) -> None:
    with pytest.raises(ApiError) as raised:
        api.get(MISSING)
    error = raised.value
    assert (error.code, error.reason, error.message) == (404, "NotFound",
                                                          'pods "missing" not found')
    assert error.status == NOT_FOUND
    assert str(error) == 'pods "missing" not found'
    assert error.__notes__ == [f"GET {MISSING}: 404 NotFound"]


def test_exists_is_false_on_404_only(api: Api) -> None:
    assert api.exists(path_of("v1", "namespaces", name="x"))
    assert not api.exists(MISSING)
    with pytest.raises(ApiError) as raised:
        api.exists("/text")
    assert raised.value.code == 500


def test_an_answer_that_is_no_status_keeps_its_text_as_the_message(api: Api) -> None:
    with pytest.raises(ApiError) as raised:
        api.get("/text")
    error = raised.value
    assert (error.code, error.reason, error.message) == (500, "", "upstream broke")
    assert error.status == {"apiVersion": "v1", "kind": "Status", "metadata": {},
                            "status": "Failure", "message": "upstream broke", "reason": "",
                            "code": 500}
    assert error.__notes__ == ["GET /text: 500"]


def test_an_empty_answer_names_the_http_code(api: Api) -> None:
    with pytest.raises(ApiError) as raised:
        api.get("/empty")
    assert (raised.value.code, raised.value.reason, raised.value.message) == (403, "",
                                                                               "HTTP 403")
