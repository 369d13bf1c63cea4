"""One run of `dra-gateway demo`: the work directory, bringing the components up, the steps in
order, the output (table or JSON), and stopping every child whatever happens (errors, Ctrl-C,
SIGTERM).

It must not hold the steps' logic: it calls the other demo modules in order and reports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from dra_gateway.devkit.demo.common import (
    DEFAULT_PODS,
    GRACE_S,
    NAMESPACE,
    NODES,
    QUOTA_POLICIES,
    DemoError,
    text_width,
)
from dra_gateway.devkit.demo.inspection import (
    PodReport,
    create_pods,
    describe_devices,
    inspect,
    prepare_on_nodes,
    show_template,
    wait_bound,
)
from dra_gateway.devkit.demo.pods import DemoPod, read_pods
from dra_gateway.devkit.demo.processes import (
    Children,
    Layout,
    _api_started,
    _webhook_ssl,
    allocator_leads,
    free_port,
    log_tail,
    prepare,
    slices_published,
    start_api,
    start_components,
    wait_for,
    webhook_ready,
)
from dra_gateway.devkit.demo.quota import QuotaReport, print_quota, show_quota

# Longest work directory whose node folders still fit a kubelet socket path (107 bytes).
_SHORT_PATH = 48


class _Terminated(BaseException):
    """SIGTERM reached the demo: unwind like Ctrl-C so that every child is stopped."""


@dataclass
class DemoReport:
    """What the demo's run found: each pod's report, the ResourceClaimTemplate shown (and
    whose it is), and the quota step's report when it ran."""

    pods: list[PodReport]
    template: dict[str, Any] | None
    template_of: str | None
    quota: QuotaReport | None = None


async def demo(layout: Layout, children: Children, pods: Sequence[DemoPod], *,
               startup_s: float, place_s: float, say: Callable[[str], None],
               quota: bool = False) -> DemoReport:
    from dra_gateway.kube.cluster.connect import ClusterConfigError, connect
    from dra_gateway.kube.cluster.port import ApiError

    webhook_port = free_port()
    say("starting the embedded API server")
    api = start_api(children, layout, webhook_port,
                    policies=(QUOTA_POLICIES,) if quota else ())
    deadline = time.monotonic() + startup_s

    async def api_up() -> bool:
        return _api_started(layout, api)

    await wait_for("starting the API server", children, deadline, api, api_up,
                   "the API server to write its kubeconfig")
    say("starting the webhook, the allocator and node plugins for "
        + ", ".join(n for n, _ in NODES))
    start_components(children, layout, webhook_port)
    try:
        cluster = await connect("kube", str(layout.kubeconfig))
    except ClusterConfigError as exc:
        raise DemoError("connecting to the API server", str(exc), log=api.log) from None
    try:
        by_name = {c.name: c for c in children.started}
        context = _webhook_ssl(layout)

        async def webhook_up() -> bool:
            return await webhook_ready(webhook_port, context)

        await wait_for("starting the webhook", children, deadline, by_name["webhook"],
                       webhook_up, f"the webhook's /readyz on 127.0.0.1:{webhook_port}")
        for node, _ in NODES:
            async def published(node: str = node) -> bool:
                return node in await slices_published(cluster)

            await wait_for("starting the node plugins", children, deadline,
                           by_name[f"node-plugin-{node}"], published,
                           f"node {node}'s ResourceSlices")

        async def leads() -> bool:
            return await allocator_leads(cluster)

        await wait_for("starting the allocator", children, deadline, by_name["allocator"],
                       leads, f"the allocator to take its Lease {NAMESPACE}/"
                       "dra-gateway-allocator")
        say(f"creating {len(pods)} pods")
        reports = await create_pods(cluster, pods)
        await wait_bound(cluster, children, reports, time.monotonic() + place_s)
        # Pods expected to stay pending are judged once the others settled.
        await inspect(cluster, reports)
        await prepare_on_nodes(layout, reports)
        template, template_of = await show_template(cluster, reports)
        quota_report = await show_quota(cluster, children, place_s=place_s, say=say) \
            if quota else None
        return DemoReport(reports, template, template_of, quota_report)
    except ApiError as exc:
        raise DemoError("talking to the API server", exc.message, log=api.log) from None
    finally:
        await cluster.close()


_GAP = "  "
_MIN_WRAPPED = 16


def fit_columns(rows: Sequence[Sequence[str]], width: int | None = None,
                wrapped: Sequence[int] = ()) -> list[str]:
    """The rows as aligned columns within `width` (the terminal's by default): the columns in
    `wrapped` (indexes) are narrowed, widest first, and their cells wrapped at spaces onto
    lines of their own; a word is never cut, so a column is never narrower than its longest
    word (the line then runs past `width`)."""
    import textwrap

    width = text_width() if width is None else width
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    floors = [max([_MIN_WRAPPED, *(len(w) for row in rows for w in row[i].split())])
              for i in range(len(widths))]
    while sum(widths) + len(_GAP) * (len(widths) - 1) > width:
        candidates = [i for i in wrapped if widths[i] > floors[i]]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: widths[i])
        widths[widest] -= 1
    lines: list[str] = []
    for row in rows:
        cells = [textwrap.wrap(cell, widths[i], break_on_hyphens=False,
                               break_long_words=False) or [""]
                 if i in wrapped else [cell] for i, cell in enumerate(row)]
        for n in range(max(len(c) for c in cells)):
            parts = [(c[n] if n < len(c) else "").ljust(widths[i]) for i, c in enumerate(cells)]
            lines.append(_GAP.join(parts).rstrip())
    return lines


def _node_cell(r: PodReport) -> str:
    if r.node:
        return r.node
    if r.refused:
        return "(refused)"
    if r.never_fits:
        return "(never fits)"
    return "(pending)" if r.expected == "pending" else "(not bound)"


def print_table(reports: Sequence[PodReport], out: IO[str]) -> None:
    rows = [("POD", "LEGACY REQUEST [RULE]", "TEMPLATE", "NODE", "DEVICES (SHARE)")]
    for r in reports:
        devices = "; ".join(describe_devices(c["devices"]) for c in r.claims if c["devices"])
        rows.append((f"{r.namespace}/{r.name}", r.legacy + (f" [{r.rule}]" if r.rule else ""),
                     ", ".join(r.templates) or "-", _node_cell(r), devices or "-"))
    for line in fit_columns(rows, wrapped=(1, 2, 4)):
        out.write(line + "\n")
    if any(d["cores"] is not None for r in reports for c in r.claims for d in c["devices"]):
        out.write("\n" + _fill("N% cores: the share of the card's compute (streaming "
                               "multiprocessors) the claim holds; a whole card is 100%.") + "\n")
    for r in reports:
        pod = f"{r.namespace}/{r.name}"
        if r.expected == "pending" and r.ok:
            out.write("\n" + _fill(f"{pod} stays pending as expected: {r.why_pending}.") + "\n")
        elif r.refused:
            out.write("\n" + _fill(f"REFUSED {pod} ({r.source}): the API refused to create "
                                   f"it: {r.refused}") + "\n")
        elif r.never_fits:
            out.write("\n" + _fill(f"NEVER FITS {pod}: no pod was bound for a while and the "
                                   f"allocator still says: {r.never_fits}") + "\n")
        else:
            for problem in r.problems:
                out.write("\n" + _fill(f"FAILED {pod}: {problem}") + "\n")


def verdict(report: DemoReport) -> str:
    """One line: how many pods landed as expected, and what became of the others."""
    pods = report.pods
    landed = [r for r in pods if r.ok]
    parts = [f"demo: {len(landed)} of {len(pods)} pod{'s' if len(pods) != 1 else ''} "
             "landed as expected"]
    on_purpose = [r for r in landed if r.expected == "pending"]
    if on_purpose:
        parts.append(f"{len(on_purpose)} pending on purpose ("
                     + ", ".join(f"{r.namespace}/{r.name}" for r in on_purpose) + ")")
    for label, chosen in (("refused", [r for r in pods if r.refused]),
                          ("never fit", [r for r in pods if r.never_fits]),
                          ("failed otherwise", [r for r in pods if not r.ok and not r.refused
                                                and not r.never_fits])):
        if chosen:
            parts.append(f"{len(chosen)} {label} ("
                         + ", ".join(f"{r.namespace}/{r.name}" for r in chosen) + ")")
    if report.quota is not None:
        parts.append("the quota step " + ("worked" if report.quota.ok else "failed"))
    return "; ".join(parts)


# What HAMi-core's variables mean: their values are bare numbers in its own units.
_ENV_UNITS = {"CUDA_DEVICE_MEMORY_LIMIT": "HAMi-core's MiB: the card memory the container may "
                                          "allocate",
              "CUDA_DEVICE_SM_LIMIT": "percent of the card's compute"}


def explain_env(entry: str) -> str:
    """An environment entry with what its value means, where HAMi-core's units need it."""
    name = entry.split("=", 1)[0]
    base = name.rstrip("0123456789").rstrip("_") if name[-1:].isdigit() else name
    why = _ENV_UNITS.get(base)
    return f"{entry}  ({why})" if why else entry


def _fill(text: str) -> str:
    import textwrap

    return textwrap.fill(text, text_width(), break_on_hyphens=False, break_long_words=False)


def _short_temp_dir() -> str:
    """Where the node folders go when the work directory is too long for their sockets: the
    temporary directory if short enough (mkdtemp adds 23 characters), else /tmp ($TMPDIR may
    be as long as the work directory)."""
    temp = tempfile.gettempdir()
    return temp if len(temp) + 23 <= _SHORT_PATH else "/tmp"


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def run(args: argparse.Namespace) -> int:
    err = sys.stderr
    as_json = args.output == "json"

    def say(text: str) -> None:
        if not as_json:
            print(f"demo: {text}", flush=True)

    for option, value in (("--timeout", args.timeout), ("--startup-timeout",
                                                         args.startup_timeout)):
        if not value > 0:
            print(f"demo: {option} {value:g} must be a positive number of seconds", file=err)
            return 2
    try:
        pods = read_pods(args.pods or DEFAULT_PODS)
    except DemoError as exc:
        print(f"demo: {exc}", file=err)
        return 2
    try:
        if args.work_dir is not None:
            root = args.work_dir.resolve()
            root.mkdir(parents=True, exist_ok=True)
            remove = False
        else:
            root = Path(tempfile.mkdtemp(prefix="dra-gateway-demo-"))
            remove = not args.keep
        if len(str(root)) <= _SHORT_PATH:
            nodes_root, remove_nodes = root / "n", False
        else:
            nodes_root = Path(tempfile.mkdtemp(prefix="dra-gateway-n-", dir=_short_temp_dir()))
            remove_nodes = not args.keep
    except OSError as exc:
        print(f"demo: cannot create the work directory {exc.filename or ''}: "
              f"{exc.strerror or exc}; pass a writable --work-dir", file=err)
        return 2
    layout = Layout(root, nodes_root)
    children = Children(layout.logs)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    code = 1
    report: DemoReport | None = None
    failure: DemoError | None = None
    reported = False  # --serve reports before it serves
    try:
        say(f"work directory {root}")
        prepare(layout)
        # The quota step needs the bundled examples' room on the nodes: pods of --pods may
        # fill them.
        report = asyncio.run(demo(layout, children, pods, startup_s=args.startup_timeout,
                                  place_s=args.timeout, say=say, quota=not args.pods))
        code = 0 if all(r.ok for r in report.pods) \
            and (report.quota is None or report.quota.ok) else 1
        if args.serve:
            _write_report(report, code, root, remove=False, as_json=as_json, layout=layout)
            reported = True
            _serve(layout, children)
    except DemoError as exc:
        failure = exc
    except (KeyboardInterrupt, _Terminated):
        print("demo: interrupted; stopping every process it started", file=err)
        code = 130
    except OSError as exc:
        failure = DemoError("setting up", f"{exc.filename or 'the work directory'}: "
                            f"{exc.strerror or exc}")
    except Exception as exc:  # a bug: keep the trace for a report, but show no trace
        trace = layout.logs / "demo-error.log"
        with contextlib.suppress(OSError):
            trace.parent.mkdir(parents=True, exist_ok=True)
            trace.write_text(traceback.format_exc(), encoding="utf-8")
        failure = DemoError("running the demo", f"unexpected {type(exc).__name__}: {exc} "
                            f"(please report it with {trace})")
    finally:
        try:
            killed = children.stop()
        except (KeyboardInterrupt, _Terminated):
            killed = children.stop(grace=0)  # asked twice: no more patience
        signal.signal(signal.SIGTERM, previous)
    if killed:
        print(f"demo: {', '.join(killed)} did not stop within {GRACE_S:g}s of SIGTERM and was "
              "killed", file=err)
    if failure is not None:
        if as_json:
            json.dump({"ok": False, "failedStep": failure.step, "message": failure.message,
                       "log": str(failure.log) if failure.log else None, "workDir": str(root)},
                      sys.stdout, indent=2)
            sys.stdout.write("\n")
        print(f"demo: failed at step \"{failure.step}\": {failure.message}", file=err)
        if failure.log is not None:
            print(f"--- last lines of {failure.log} ---\n{log_tail(failure.log)}\n---", file=err)
        remove = False  # the logs are what the user needs now
    if report is not None:
        if code != 0:
            remove = False  # the logs explain it; the JSON summary must say where they are
        if not reported:
            _write_report(report, code, root, remove=remove, as_json=as_json, layout=layout)
    if remove_nodes:
        shutil.rmtree(nodes_root, ignore_errors=True)
    elif nodes_root.parent != root:
        print(f"demo: the node plugins' sockets and CDI specs are in {nodes_root}", file=err)
    if remove:
        shutil.rmtree(root, ignore_errors=True)
    elif code != 130 or args.keep:
        print(f"demo: logs, kubeconfig and certificates kept in {root}", file=err)
    return code


def _write_report(report: DemoReport, code: int, root: Path, *, remove: bool,
                  as_json: bool, layout: Layout) -> None:
    """The run's output: the JSON summary or the tables, then what failed, on stderr."""
    err = sys.stderr
    if as_json:
        summary = {"ok": code == 0, "workDir": str(root) if not remove else None,
                   "pods": [r.to_json() for r in report.pods],
                   "template": {"pod": report.template_of, "object": report.template},
                   "quota": report.quota.to_json() if report.quota else None}
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_report(report, sys.stdout)
        sys.stdout.write("\n" + verdict(report) + "\n")
    sys.stdout.flush()
    if report.quota is not None and not report.quota.ok:
        print(f"demo: failed at step \"showing a quota at work\": "
              f"{'; '.join(report.quota.problems)}; the allocator's log is "
              f"{layout.logs / 'allocator.log'}", file=err)
    failed = [f"{r.namespace}/{r.name}" for r in report.pods if not r.ok]
    if failed:
        print(f"demo: failed at step \"checking placements\": {len(failed)} pod"
              f"{'s' if len(failed) != 1 else ''} not placed as expected: "
              f"{', '.join(failed)}; each component's log is in {layout.logs}", file=err)
        # The allocator's log helps only where the demo has no one's words for the pod.
        if any(not r.ok and not r.node and r.expected == "bound" and not r.refused
               and not r.never_fits for r in report.pods):
            allocator_log = layout.logs / "allocator.log"
            print(f"--- last lines of {allocator_log} ---\n{log_tail(allocator_log)}\n---",
                  file=err)


SERVE_READY = "demo: serving the embedded cluster until Ctrl-C"


def command_name(*, executable: str | None = None, cwd: Path | None = None) -> str:
    """How the user's shell runs this installation's `dra-gateway`: the bare name where PATH
    finds it, else the script's path beside the interpreter (`.venv/bin/dra-gateway` after the
    README's install, whose venv is not activated), else `python -m dra_gateway`."""
    bin_dir = Path(executable or sys.executable).parent
    script = bin_dir / "dra-gateway"
    found = shutil.which("dra-gateway")
    if found is not None and Path(found).resolve() == script.resolve():
        return "dra-gateway"
    if not script.exists():
        return f"{executable or sys.executable} -m dra_gateway"
    here = (cwd or Path.cwd()).resolve()
    absolute = bin_dir.resolve() / "dra-gateway"
    with contextlib.suppress(ValueError):
        return str(absolute.relative_to(here))
    return str(absolute)


def _serve(layout: Layout, children: Children) -> None:
    """Keep the cluster and its components running for the user to explore, until Ctrl-C or
    SIGTERM (or a component ends on its own, which is said)."""
    kubeconfig = layout.kubeconfig
    command = command_name()
    lines = [f"{SERVE_READY}; its kubeconfig is {kubeconfig}. Try, in another shell:",
             f"  export KUBECONFIG={kubeconfig}",
             "  kubectl get pods,resourceclaims -A",
             "  kubectl get resourceslices",
             "  kubectl get gpuquotas -A",
             "  kubectl get pods -A -o wide",
             f"  {command} report",
             f"  {command} migrate plan",
             f"  {command} defrag plan",
             f"Each component's log is in {layout.logs}."]
    print("\n" + "\n".join(lines), file=sys.stderr, flush=True)
    try:
        while True:
            ended = children.ended()
            if ended:
                print(f"demo: {', '.join(ended)} ended on its own; stopping the rest (its "
                      f"log is in {layout.logs})", file=sys.stderr)
                return
            time.sleep(0.5)
    except (KeyboardInterrupt, _Terminated):
        print("demo: stopping every process it started", file=sys.stderr, flush=True)


def _print_report(report: DemoReport, out: IO[str]) -> None:
    import yaml

    out.write("\n")
    print_table(report.pods, out)
    if report.quota is not None:
        print_quota(report.quota, out)
    if report.template is not None:
        out.write("\n" + _fill(f"The ResourceClaimTemplate of pod {report.template_of}, as "
                               "the webhook translated its legacy request:") + "\n\n")
        out.write(yaml.safe_dump(report.template, sort_keys=False))
        shown = next((r for r in report.pods
                      if f"{r.namespace}/{r.name}" == report.template_of), None)
        prepared = [c["prepared"] for c in (shown.claims if shown else [])
                    if c.get("prepared")]
        if prepared:
            ids = "".join(f"  {i}\n" for p in prepared for i in p["cdiDevices"])
            out.write("\nIts node plugin prepared the claim as the kubelet asks it to, with "
                      f"the CDI devices\n{ids}and the container sees:\n\n")
            out.write("".join(f"  {explain_env(e)}\n" for p in prepared for e in p["env"]))
