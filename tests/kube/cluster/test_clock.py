"""The cluster's time read from the API server's Date header: bounds that hold whatever this
machine's clock says, and the adapter reading the header as the API server sends it."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.cluster.clock import read_clock
from dra_gateway.kube.cluster.connect import connect
from dra_gateway.kube.cluster.port import ApiError

SERVED = datetime(2026, 12, 6, 10, 0, 5, 700_000, tzinfo=UTC)  # the API server's clock


class _Local:
    """This machine's clock: ten minutes ahead, moving a tenth of a second per read."""

    def __init__(self) -> None:
        self.now = SERVED + timedelta(minutes=10)

    def __call__(self) -> datetime:
        self.now += timedelta(milliseconds=100)
        return self.now


async def test_the_clock_follows_the_api_server_not_this_machine() -> None:
    local = _Local()
    clock = await read_clock(MemoryCluster(clock=lambda: SERVED), local=local)
    # Read with a round trip of 0.1 s: the API server said 10:00:05, it was 10:00:05.7.
    latest = clock.latest()
    assert SERVED <= latest <= SERVED + timedelta(seconds=1.5)
    assert abs(clock.now() - SERVED) < timedelta(seconds=1)


async def test_the_latest_time_is_never_before_the_servers_second_ends() -> None:
    """A clear at the latest time forgets a fault in the same second as the clear."""
    for fraction in (0, 500_000, 999_999):
        served = SERVED.replace(microsecond=fraction)
        clock = await read_clock(MemoryCluster(clock=lambda s=served: s),
                                 local=_Local())
        assert clock.latest() >= served


def _endpoint(tmp_path: Path, date: str | None) -> tuple[http.server.ThreadingHTTPServer, Path]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response_only(200)
            if date is not None:
                self.send_header("Date", date)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"gitVersion": "v1.35.0"}).encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {
            "server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    return server, kubeconfig


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    server, kubeconfig = _endpoint(tmp_path, request.param)
    yield kubeconfig
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("served", ["Sun, 06 Dec 2026 10:00:05 GMT"], indirect=True)
async def test_the_adapter_reads_the_date_the_api_server_answers_with(served: Path) -> None:
    cluster = await connect("kube", str(served))
    try:
        assert await cluster.server_time() == SERVED.replace(microsecond=0)
    finally:
        await cluster.close()


@pytest.mark.parametrize("served", [None, "yesterday"], indirect=True)
async def test_an_answer_without_a_readable_date_is_an_error_that_says_so(served: Path) -> None:
    cluster = await connect("kube", str(served))
    try:
        with pytest.raises(ApiError, match="without a readable Date header"):
            await cluster.server_time()
    finally:
        await cluster.close()
