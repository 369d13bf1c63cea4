"""`dra-gateway demo` run for real: separate processes on loopback, example pods placed.

The demo is started as a subprocess (as a user runs it), so these tests see its exit code,
its JSON summary and whether it left any of its child processes behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

EXAMPLE_PODS = {
    # pod -> node it must be on (None: any GPU node), or "pending" for a pod it cannot place
    "inference/llm-serve": None,
    "research/notebook-0": None,
    "research/notebook-1": None,
    "batch/embed-0": None,
    "batch/nightly-eval-0": None,
    "ml/finetune-master-0": "gpu-a100-1",  # MIG 3g.40gb instances exist there only
    "ml/finetune-worker-0": "gpu-a100-1",
    "ml/finetune-worker-1": "gpu-a100-1",
    "ml/finetune-worker-2": "gpu-a100-1",
    "ml/rocm-smoke": "pending",  # AMD's class: no AMD driver in the demo
    "default/web": "cpu-1",  # no GPU: the first node
    "ml/native-dra": None,
    "ml/train-resnet": None,
    "research/gpushare-notebook": None,
    "batch/vgpu-infer": None,
    "batch/gpu-share-legacy": None,
    "inference/koord-legacy-share": None,
    "inference/train-small": None,
}
GPU_NODES = {"gpu-a100-1", "gpu-h100-1"}


def _demo(*args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_gateway", "demo", *args],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes naming `text` (the demo's children name its work dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.timeout(180)
def test_demo_places_every_example_pod_on_the_node_of_its_devices(tmp_path: Path) -> None:
    work = tmp_path / "w"
    done = _demo("-o", "json", "--work-dir", str(work), "--timeout", "90")

    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)
    assert summary["ok"] is True
    pods = {f"{p['namespace']}/{p['name']}": p for p in summary["pods"]}
    assert set(pods) == set(EXAMPLE_PODS)
    seen_devices: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key, where in EXAMPLE_PODS.items():
        pod = pods[key]
        assert pod["ok"] is True, (key, pod["problems"])
        if where == "pending":
            assert pod["expected"] == "pending"
            assert pod["node"] is None
            assert "gpu.amd.com" in pod["whyPending"]
            continue
        assert pod["expected"] == "bound"
        assert pod["node"] == where if where else pod["node"] in GPU_NODES, key
        for claim in pod["claims"]:
            assert claim["allocated"] is True, (key, claim)
            assert claim["devices"], (key, claim)
            # The node plugin, asked as the kubelet asks, prepared it into CDI devices.
            assert claim["prepared"]["error"] is None, (key, claim)
            assert claim["prepared"]["cdiDevices"], (key, claim)
            for device in claim["devices"]:
                assert device["node"] == pod["node"], (key, device)
                seen_devices.setdefault((device["pool"], device["device"]), []).append(device)
    # Translation shows: templates named by the gateway, the legacy request and its rule.
    assert pods["inference/llm-serve"]["rule"] == "hami"
    assert "nvidia.com/gpumem=8000" in pods["inference/llm-serve"]["legacyRequest"]
    assert pods["inference/llm-serve"]["templates"][0].startswith("dra-gateway-")
    assert pods["default/web"]["claims"] == []
    # Shares are shares; whole cards and MIG instances are never handed out twice.
    hami = pods["inference/llm-serve"]["claims"][0]["devices"][0]
    assert (hami["share"], hami["memory"], hami["cores"]) == ("shared", 8000 * 2**20, 30)
    assert hami["enforcement"] == "hami-core"
    hami_env = pods["inference/llm-serve"]["claims"][0]["prepared"]["env"]
    assert {"CUDA_DEVICE_MEMORY_LIMIT=8000m", "CUDA_DEVICE_SM_LIMIT=30"} <= set(hami_env)
    for (pool, device), holders in seen_devices.items():
        if any(h["share"] == "whole" for h in holders):
            assert len(holders) == 1, (pool, device, holders)
        else:
            assert sum(h["cores"] for h in holders) <= 100, (pool, device, holders)
    # One quota at work: the second pod of quota-demo waited for the GPUQuota, gated with its
    # condition and an Event, and was placed once the first finished.
    quota = summary["quota"]
    assert quota["ok"] is True, quota["problems"]
    assert quota["quota"] == "quota-demo/demo-gpu"
    assert quota["firstNode"] in GPU_NODES
    message = ("exceeded quota demo-gpu: requested memory=8Gi, used memory=8Gi, limited "
               "memory=12Gi")
    assert quota["condition"]["type"] == "dra-gateway.io/QuotaExceeded"
    assert (quota["condition"]["status"], quota["condition"]["reason"]) == ("True",
                                                                            "QuotaExceeded")
    assert quota["condition"]["message"] == message
    assert quota["event"] == message
    assert quota["usedWhileWaiting"] == {"memory": "8Gi"}
    assert quota["node"] in GPU_NODES
    assert (quota["clearedCondition"]["status"], quota["clearedCondition"]["reason"]) == (
        "False", "QuotaAvailable")
    template = summary["template"]["object"]
    assert template["kind"] == "ResourceClaimTemplate"
    kubernetes_validate.validate(template, "1.34", strict=True)
    # Every process is gone; an explicit work dir stays, with each component's log.
    assert _processes_mentioning(str(work)) == []
    logs = {p.name for p in (work / "logs").iterdir()}
    assert logs == {"cluster.log", "webhook.log", "allocator.log",
                    "node-plugin-gpu-a100-1.log", "node-plugin-gpu-h100-1.log"}


def test_the_quota_step_is_printed_for_people(monkeypatch: pytest.MonkeyPatch) -> None:
    from io import StringIO

    monkeypatch.setenv("COLUMNS", "120")

    from dra_gateway.devkit.demo import QuotaReport, print_quota

    report = QuotaReport("quota-demo/demo-gpu", hard={"memory": "12Gi"},
                         first="quota-demo/first", first_node="gpu-h100-1",
                         waiting="quota-demo/second",
                         condition={"status": "True", "reason": "QuotaExceeded",
                                    "message": "exceeded quota demo-gpu: requested memory=8Gi, "
                                               "used memory=8Gi, limited memory=12Gi"},
                         event="exceeded quota demo-gpu: requested memory=8Gi, used memory=8Gi, "
                               "limited memory=12Gi",
                         used_while_waiting={"memory": "8Gi"}, node="gpu-a100-1",
                         cleared={"status": "False", "reason": "QuotaAvailable"})
    out = StringIO()
    print_quota(report, out)
    assert out.getvalue().splitlines() == [
        "",
        "One quota at work: GPUQuota quota-demo/demo-gpu (hard memory=12Gi).",
        "  quota-demo/first   placed on gpu-h100-1",
        # Wrapped to fit a 120-column terminal.
        "  quota-demo/second  waits, gated: condition dra-gateway.io/QuotaExceeded=True "
        "(QuotaExceeded): exceeded quota demo-gpu:",
        "                     requested memory=8Gi, used memory=8Gi, limited memory=12Gi",
        "                     Event QuotaExceeded: exceeded quota demo-gpu: requested "
        "memory=8Gi, used memory=8Gi, limited",
        "                     memory=12Gi",
        "                     status.used of the quota: memory=8Gi",
        "  quota-demo/first   finished (phase Succeeded): its claim released",
        "  quota-demo/second  placed on gpu-a100-1 (condition False: QuotaAvailable)",
    ]


def test_pods_file_that_is_not_yaml_is_refused_before_anything_starts(tmp_path: Path) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: [unclosed\n", encoding="utf-8")
    work = tmp_path / "w"

    done = _demo("--pods", str(pods), "--work-dir", str(work), timeout=60)

    assert done.returncode == 2
    assert done.stderr.startswith(f"demo: reading pods: {pods} is not valid YAML at line ")
    assert "Traceback" not in done.stderr
    assert not work.exists()


def test_pods_file_without_a_pod_names_the_document(tmp_path: Path) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n",
                    encoding="utf-8")

    done = _demo("--pods", str(pods), "--work-dir", str(tmp_path / "w"), timeout=60)

    assert done.returncode == 2
    assert done.stderr == (f"demo: reading pods: {pods} (document 1): ConfigMap settings holds "
                           "no pod (no spec.containers anywhere); give Pods or workloads\n")


@pytest.mark.timeout(150)
def test_a_refused_pod_and_one_that_never_fits_are_reported_and_the_others_go_on(
        tmp_path: Path) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: too-much, namespace: ml}\n"
        "spec:\n  containers:\n    - name: c\n      image: busybox\n      resources:\n"
        "        limits: {nvidia.com/gpu: 1, nvidia.com/gpumem-percentage: 150}\n"
        "---\n"
        "apiVersion: v1\nkind: Pod\nmetadata: {name: nine-gpus, namespace: ml}\n"
        "spec:\n  containers:\n    - name: c\n      image: busybox\n      resources:\n"
        "        limits: {nvidia.com/gpu: 9}\n"
        "---\n"
        "apiVersion: v1\nkind: Pod\nmetadata: {name: one-gpu, namespace: ml}\n"
        "spec:\n  containers:\n    - name: c\n      image: busybox\n      resources:\n"
        "        limits: {nvidia.com/gpu: 1}\n",
        encoding="utf-8")
    work = tmp_path / "w"

    # A timeout far beyond the test's: the demo must stop waiting for the pod by itself.
    done = _demo("--pods", str(pods), "--work-dir", str(work), "--timeout", "10m",
                 "-o", "json", timeout=140)

    assert done.returncode == 1, done.stderr
    refused, never, landed = json.loads(done.stdout)["pods"]
    assert "nvidia.com/gpumem-percentage is a share of one card, at most 100" in refused["refused"]
    assert refused["ok"] is False
    assert refused["node"] is None
    assert never["neverFits"].startswith("pod ml/nine-gpus: 0/3 nodes fit")
    assert landed["ok"] is True
    assert landed["node"] in GPU_NODES
    assert ('demo: failed at step "checking placements": 2 pods not placed as expected: '
            "ml/too-much, ml/nine-gpus") in done.stderr
    assert "--- last lines of" not in done.stderr  # the allocator's words, no raw log
    assert "Traceback" not in done.stderr
    assert _processes_mentioning(str(work)) == []
    assert os.listdir(work / "logs")


@pytest.mark.timeout(120)
def test_pods_not_placed_as_expected_fail_the_demo_and_say_why(tmp_path: Path) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: nine-gpus, namespace: ml}\n"
        "spec:\n  containers:\n    - name: c\n      image: busybox\n      resources:\n"
        "        limits: {nvidia.com/gpu: 9}\n"
        "---\n"  # the webhook skips the gateway's own namespace: nothing translates this one
        "apiVersion: v1\nkind: Pod\nmetadata: {name: skipped, namespace: dra-gateway}\n"
        "spec:\n  containers:\n    - name: c\n      image: busybox\n      resources:\n"
        "        limits: {nvidia.com/gpu: 1}\n",
        encoding="utf-8")
    work = tmp_path / "w"

    done = _demo("--pods", str(pods), "--work-dir", str(work), "--timeout", "5", "-o", "json")

    assert done.returncode == 1, done.stderr
    unplaced, skipped = json.loads(done.stdout)["pods"]
    assert unplaced["ok"] is False
    assert unplaced["problems"][0] == "not bound (still gated by dra-gateway.io/allocation)"
    assert unplaced["problems"][1].startswith(
        "dra-gateway-allocator: AllocationFailed: pod ml/nine-gpus: 0/3 nodes fit")
    assert skipped["problems"] == [
        "its request nvidia.com/gpu=1 was not translated into a claim: no rule matches it, or "
        "the webhook skips its namespace (it skips dra-gateway and kube-system)"]
    assert ('demo: failed at step "checking placements": 2 pods not placed as expected: '
            "ml/nine-gpus, dra-gateway/skipped") in done.stderr
    assert _processes_mentioning(str(work)) == []


def test_workloads_become_the_pods_their_controllers_would_create() -> None:
    from dra_gateway.devkit.demo import pods_of

    container = {"name": "c", "image": "busybox"}
    template = {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [container]}}
    documents = [
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "web", "namespace": "team"},
         "spec": {"replicas": 2, "template": template}},
        {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
         "spec": {"jobTemplate": {"spec": {"template": template}}}},
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "ft"},
         "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template},
                                          "Worker": {"replicas": 2, "template": template}}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "solo"},
         "spec": {"containers": [container]}},
    ]

    pods = pods_of(documents, "pods.yaml")

    assert [(p.namespace, p.name, p.source) for p in pods] == [
        ("team", "web-0", "Deployment team/web"), ("team", "web-1", "Deployment team/web"),
        ("default", "nightly-0", "CronJob nightly"),
        ("default", "ft-master-0", "PyTorchJob ft"), ("default", "ft-worker-0", "PyTorchJob ft"),
        ("default", "ft-worker-1", "PyTorchJob ft"),
        ("default", "solo", "Pod solo"),
    ]
    assert pods[0].pod == {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"labels": {"app": "a"}, "name": "web-0",
                                        "namespace": "team"},
                           "spec": {"containers": [container]}}


def test_the_same_pod_twice_is_refused_by_name() -> None:
    from dra_gateway.devkit.demo import DemoError, pods_of

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "ml"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}

    with pytest.raises(DemoError) as caught:
        pods_of([pod, pod], "pods.yaml")

    assert str(caught.value) == ("reading pods: pod ml/a (Pod ml/a) appears twice; give each "
                                 "pod or workload its own name")


@pytest.mark.timeout(120)
def test_json_summary_of_a_failed_run_names_the_work_directory_it_kept(tmp_path: Path) -> None:
    # Without --work-dir the demo keeps its temporary directory when a pod is not placed; the
    # summary said "workDir": null while stderr said where the logs were kept. And a $TMPDIR
    # too long for the node plugins' sockets made the demo fail to start (it put the node
    # folders there too).
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: nine-gpus, namespace: ml}\n"
        "spec:\n  containers:\n    - name: c\n      image: busybox\n      resources:\n"
        "        limits: {nvidia.com/gpu: 9}\n", encoding="utf-8")
    temp = tmp_path / "tmp"
    temp.mkdir()

    done = subprocess.run(
        [sys.executable, "-m", "dra_gateway", "demo", "--pods", str(pods), "--timeout", "3",
         "-o", "json"], capture_output=True, text=True, timeout=100, check=False,
        stdin=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(temp)})

    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    assert summary["ok"] is False
    assert "failedStep" not in summary, summary  # it started: a long $TMPDIR is no matter
    assert summary["pods"][0]["problems"][0] == ("not bound (still gated by "
                                                 "dra-gateway.io/allocation)")
    assert summary["workDir"] is not None
    work = Path(summary["workDir"])
    assert (work / "logs" / "allocator.log").is_file()
    assert f"demo: logs, kubeconfig and certificates kept in {work}" in done.stderr
    assert _processes_mentioning(str(work)) == []


def test_pods_file_that_is_not_text_is_refused_without_a_traceback(tmp_path: Path) -> None:
    from dra_gateway.devkit.demo import DemoError, read_pods

    pods = tmp_path / "pods.yaml"
    pods.write_bytes(b"\xff\xfe\x00binary")

    with pytest.raises(DemoError) as caught:
        read_pods([pods])

    assert str(caught.value) == (f"reading pods: {pods} is not a text file (not UTF-8): pass "
                                 "YAML or JSON manifests to --pods")


def test_the_items_of_a_list_are_pods_of_their_own() -> None:
    # What `kubectl get pods -o yaml` writes: the demo refused it as not a Kubernetes object.
    from dra_gateway.devkit.demo import DemoError, pods_of

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "ml"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
              "items": [pod, {**pod, "metadata": {"name": "b"}}]}

    pods = pods_of([listed], "pods.yaml")

    assert [(p.namespace, p.name) for p in pods] == [("ml", "a"), ("default", "b")]
    with pytest.raises(DemoError) as caught:
        pods_of([{**listed, "items": [pod, {"kind": "Pod"}]}], "pods.yaml")
    assert str(caught.value) == ("reading pods: pods.yaml (document 1, item 2): expected a "
                                 "Kubernetes object with apiVersion, kind and metadata")


def test_a_replica_count_beyond_the_demo_is_refused_by_name() -> None:
    # Each replica became a pod in memory first: replicas: 1000000000 hung the demo.
    from dra_gateway.devkit.demo import MAX_PODS, DemoError, pods_of

    template = {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "web", "namespace": "team"},
                  "spec": {"replicas": 1_000_000_000, "template": template}}

    with pytest.raises(DemoError) as caught:
        pods_of([deployment], "pods.yaml")

    assert str(caught.value) == (
        f"reading pods: pods.yaml (document 1): Deployment team/web asks for 1000000000 "
        f"replicas; the demo creates at most {MAX_PODS} pods on its three nodes: lower its "
        "replicas")
    deployment["spec"]["replicas"] = MAX_PODS
    assert len(pods_of([deployment], "pods.yaml")) == MAX_PODS


@pytest.mark.timeout(180)
def test_serve_keeps_the_cluster_to_explore_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    work = tmp_path / "w"
    with subprocess.Popen(
            [sys.executable, "-m", "dra_gateway", "demo", "--serve", "--work-dir", str(work),
             "--pods", str(Path(__file__).resolve().parents[2] / "examples/pods/hami.yaml")],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, preexec_fn=_ctrl_c_delivered) as demo:
        try:
            _explore_then_stop(demo, work)
            assert _processes_mentioning(str(work)) == []  # it stopped every child it started
        finally:
            if demo.poll() is None:
                # Asked to stop as a user would, so that it stops its children too; a kill
                # would leave them running.
                demo.send_signal(signal.SIGTERM)
                try:
                    demo.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    demo.kill()
            for line in _processes_mentioning(str(work)):
                os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)  # ours, left by a failure


def _ctrl_c_delivered() -> None:
    """In the demo's process: SIGINT as a terminal delivers it. A suite started in the
    background of a non-interactive shell (`.ci/run &`) ignores SIGINT; the demo would inherit
    that, and the Ctrl-C below would never reach it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _explore_then_stop(demo: subprocess.Popen[str], work: Path) -> None:
    assert demo.stderr is not None
    assert demo.stdout is not None
    said: list[str] = []
    for line in demo.stderr:
        said.append(line)
        if line.startswith("demo: serving the embedded cluster until Ctrl-C"):
            break
    else:
        raise AssertionError("the demo never served: " + "".join(said))
    kubeconfig = work / "kubeconfig"
    assert next(demo.stderr).strip() == f"export KUBECONFIG={kubeconfig}"
    # The cluster is still there: the commands it suggests read it.
    report = subprocess.run(
        [sys.executable, "-m", "dra_gateway", "report", "-o", "json", "--kubeconfig",
         str(kubeconfig)], capture_output=True, text=True, timeout=60, check=False)
    assert report.returncode == 0, report.stderr
    holders = {h["pod"] for card in json.loads(report.stdout)["cards"] for h in card["holders"]}
    assert "llm-serve" in holders
    demo.send_signal(signal.SIGINT)
    assert demo.wait(timeout=60) == 0
    out = demo.stdout.read()
    assert "inference/llm-serve" in out
    assert max(len(line) for line in out.splitlines()) <= 120
    # The container section shows a HAMi pod's limits.
    assert "CUDA_DEVICE_MEMORY_LIMIT=8000m" in out
    assert "CUDA_DEVICE_SM_LIMIT=30" in out
    assert "did not stop" not in demo.stderr.read()


def _report(name: str, **fields: Any) -> Any:
    from dra_gateway.devkit.demo import PodReport

    namespace, pod = name.split("/")
    return PodReport(namespace, pod, "Pod " + name, fields.pop("legacy", "nvidia.com/gpu=1"),
                     "nvidia", fields.pop("templates", []), fields.pop("expected", "bound"),
                     **fields)


def test_table_wraps_cells_at_words_within_the_terminal_width(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from io import StringIO

    from dra_gateway.devkit.demo import print_table

    monkeypatch.setenv("COLUMNS", "100")
    legacy = ("nvidia.com/gpu=1 nvidia.com/gpumem=10000 nvidia.com/gpucores=30 "
              "nvidia.com/gpumem-percentage=25")
    reports = [_report("inference/llm-serve", legacy=legacy, templates=["llm-serve-gpu"],
                       node="gpu-a100-1", claims=[{"devices": [{
                           "device": "gpu-0-mig-3g.40gb-0", "share": "shared",
                           "memory": 10000 * 2**20, "cores": 30, "enforcement": "hami-core"}]}])]
    out = StringIO()
    print_table(reports, out)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100
    words = out.getvalue().split()
    for token in legacy.split():
        assert token in words  # never cut mid-word


def test_width_follows_the_terminal_with_a_sane_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_gateway.devkit.demo.common import MIN_TEXT_WIDTH, text_width

    monkeypatch.setenv("COLUMNS", "200")
    assert text_width() == 200
    monkeypatch.setenv("COLUMNS", "20")
    assert text_width() == MIN_TEXT_WIDTH


def test_refused_and_never_fitting_pods_are_said_in_the_table_and_the_verdict(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from io import StringIO

    from dra_gateway.devkit.demo import DemoReport, print_table
    from dra_gateway.devkit.demo.session import verdict

    monkeypatch.setenv("COLUMNS", "120")
    refused = _report("ml/too-much", refused="admission webhook denied the request: too much",
                      problems=["refused by the API: too much"])
    never = _report("ml/nine-gpus", never_fits="pod ml/nine-gpus: 0/3 nodes fit; ...",
                    problems=["not bound"])
    pending = _report("ml/rocm-smoke", expected="pending", why_pending="DeviceClass "
                      "gpu.amd.com is not installed here")
    placed = _report("ml/one", node="gpu-h100-1")
    report = DemoReport([refused, never, pending, placed], None, None)
    out = StringIO()
    print_table(report.pods, out)
    text = out.getvalue()
    for cell in ("(refused)", "(never fits)", "(pending)"):
        assert cell in text
    assert ("REFUSED ml/too-much (Pod ml/too-much): the API refused to create it: admission "
            "webhook denied the request: too much") in text
    assert "NEVER FITS ml/nine-gpus: no pod was bound for a while and the allocator still " \
           "says: pod ml/nine-gpus: 0/3 nodes fit; ..." in text
    assert verdict(report) == (
        "demo: 2 of 4 pods landed as expected; 1 pending on purpose (ml/rocm-smoke); "
        "1 refused (ml/too-much); 1 never fit (ml/nine-gpus)")


def test_hami_units_and_core_shares_are_explained_where_shown() -> None:
    from io import StringIO

    from dra_gateway.devkit.demo import print_table
    from dra_gateway.devkit.demo.session import explain_env

    assert explain_env("CUDA_DEVICE_MEMORY_LIMIT=10000m") == (
        "CUDA_DEVICE_MEMORY_LIMIT=10000m  (HAMi-core's MiB: the card memory the container may "
        "allocate)")
    assert explain_env("CUDA_DEVICE_MEMORY_LIMIT_1=20m").endswith("(HAMi-core's MiB: the card "
                                                                  "memory the container may "
                                                                  "allocate)")
    assert explain_env("CUDA_DEVICE_SM_LIMIT=30").endswith("(percent of the card's compute)")
    assert explain_env("LD_PRELOAD=/x.so") == "LD_PRELOAD=/x.so"
    shared = _report("ml/one", node="gpu-h100-1", claims=[{"devices": [{
        "device": "gpu-0", "share": "shared", "memory": 2**30, "cores": 1,
        "enforcement": "hami-core"}]}])
    out = StringIO()
    print_table([shared], out)
    assert "1% cores" in out.getvalue()
    assert "N% cores: the share of the card's compute" in out.getvalue()
