"""Subcommands of the translator: `translate` (rewrite manifests) and `rules check`.

Light imports only; each handler imports the translator when it runs. Exit codes of `translate`: 0
when every document was translated or left alone, 1 when any was refused (each refusal on stderr as
`error: ...`, naming document, container and resource), 2 when the input or the rules cannot be
read. `rules check`: 0 when the files load, 1 when they do not (every error printed with its path),
2 when a `--device-classes` file cannot be read. A file holding ConfigMaps (`kubectl get configmap
NAME -o yaml`) is checked as the webhook loads a rules ConfigMap, key by key, each error naming the
ConfigMap and its key.

Both take `--device-classes FILE`: the cluster's DeviceClasses (`kubectl get deviceclasses -o
yaml`), whose `spec.extendedResourceName` makes kube-scheduler serve a legacy name itself.
`translate` then leaves those names in place as the webhook does; `rules check` says which rules
step aside for which names.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from dra_gateway.kube import arguments

if TYPE_CHECKING:
    from dra_gateway.kube.progress import Progress
    from dra_gateway.translator.extended import ExtendedResources
    from dra_gateway.translator.manifests import ManifestResult
    from dra_gateway.translator.rules import RuleSet, Source

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_UNREADABLE = 2


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this component's subcommands; handlers import their heavy modules themselves."""
    translate = sub.add_parser(
        "translate", help="rewrite manifests' legacy GPU requests into DRA claims",
        description="Read a YAML or JSON stream of manifests and write it back with every pod "
                    "spec that asks for legacy GPU resources rewritten to use DRA, followed by "
                    "the ResourceClaimTemplates the rewritten pods need.")
    translate.add_argument("-f", "--filename", required=True, action="append", metavar="FILE",
                           help="manifests to translate ('-' reads standard input); repeatable, "
                                "as with kubectl: the files are read in order")
    arguments.output_option(translate, "yaml", "json")
    translate.add_argument("--explain", action="store_true",
                           help="instead of the manifests, say per container which rule fired "
                                "(or why none did), what each legacy key became and what stays "
                                "in the container and why: text, or with -o json one JSON list "
                                "of pods")
    translate.add_argument("--rules", action="append", default=[], metavar="PATH",
                           help="rule file or folder that adds or overrides rules (repeatable)")
    translate.add_argument("--no-builtin-rules", action="store_true",
                           help="use only the rules given with --rules")
    translate.add_argument("--mig-shares", action="store_true",
                           help="serve every share with MIG instances, as the webhook does in "
                                "a namespace whose GPUSharingPolicy says shares.servedBy: MIG")
    _device_classes_argument(translate)
    translate.set_defaults(func=_run_translate)

    rules = sub.add_parser("rules", help="translation rules",
                           description="The translation rules: check rule files and ConfigMaps "
                           "before the webhook loads them.")
    commands = rules.add_subparsers(dest="rules_command", metavar="COMMAND", required=True)
    check = commands.add_parser(
        "check", help="validate rule files and print every error with its path",
        description="Load the built-in rules and the given files or folders as the gateway "
                    "would, and report every problem with its file and field path. A file of "
                    "ConfigMaps (kubectl get configmap NAME -o yaml) is checked key by key, as "
                    "the webhook loads a rules ConfigMap.")
    check.add_argument("paths", nargs="+", metavar="PATH",
                       help="rule file or folder, or a file of rules ConfigMaps")
    check.add_argument("--no-builtin-rules", action="store_true",
                       help="check the files on their own, without the built-in rules")
    _device_classes_argument(check)
    check.set_defaults(func=_run_check)


def _device_classes_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device-classes", action="append", default=[], metavar="FILE",
        help="the cluster's DeviceClasses, e.g. from `kubectl get deviceclasses -o yaml` ('-' "
             "reads standard input; repeatable; other kinds are skipped): legacy names they "
             "declare as spec.extendedResourceName are left to kube-scheduler, as the webhook "
             "leaves them, unless a rule says extendedResourceNames: translate")


def _read_device_classes(args: argparse.Namespace) -> ExtendedResources | None:
    """The ExtendedResources of the --device-classes files, or None after printing why not."""
    import yaml

    from dra_gateway.translator.extended import ExtendedResources, device_class_objects
    from dra_gateway.translator.yamlinput import InputTooLarge

    objects: list[dict[str, Any]] = []
    for filename in args.device_classes:
        source = "standard input" if filename == "-" else filename
        try:
            documents = _read_stream(filename, sys.stdin)
        except OSError as exc:
            arguments.error(f"cannot read --device-classes {source}: {exc.strerror or exc}",
                            EXIT_UNREADABLE)
            return None
        except InputTooLarge as exc:
            arguments.error(f"--device-classes {exc}", EXIT_UNREADABLE)
            return None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            arguments.error(f"--device-classes {source} is not valid YAML or JSON: "
                            f"{getattr(exc, 'problem', None) or exc}", EXIT_UNREADABLE)
            return None
        found = device_class_objects(documents)
        if not found:
            print(f"warning: --device-classes {source} holds no DeviceClass; pass the output of "
                  f"`kubectl get deviceclasses -o yaml`", file=sys.stderr)
        objects.extend(found)
    return ExtendedResources.from_device_classes(objects)


def _run_check(args: argparse.Namespace) -> int:
    from dra_gateway.translator.extended import report
    from dra_gateway.translator.rules import RulesError, load_rules

    if args.device_classes.count("-") > 1:
        return arguments.error(
            "--device-classes - (standard input) can be given only once", EXIT_UNREADABLE)
    extended = _read_device_classes(args)
    if extended is None:
        return EXIT_UNREADABLE
    try:
        sources = [source for path in args.paths for source in _rule_sources(path)]
        ruleset = load_rules(*sources, builtin=not args.no_builtin_rules)
    except RulesError as exc:
        print(f"{exc.summary}:", file=sys.stdout)
        for error in exc.errors:
            print(f"  {error}", file=sys.stdout)
        return EXIT_REFUSED
    disabled = f", {len(ruleset.disabled)} disabled" if ruleset.disabled else ""
    print(f"ok: {len(ruleset.rules)} rules enabled{disabled}")
    for line in report(ruleset, extended):
        print(f"note: {line}")
    return EXIT_OK


def _rule_sources(path: str) -> list[Source]:
    """What `rules check` loads for `path`: the rules ConfigMaps a file holds, each as the
    webhook loads it (`config_map_sources`: every data key a rules document, named in each
    error), or else the file or folder itself, left to the loader to read and report on."""
    import yaml

    from dra_gateway.translator.rules import config_map_sources
    from dra_gateway.translator.yamlinput import InputTooLarge

    if path == "-" or Path(path).is_dir():
        return [path]
    try:
        documents = _read_stream(path, sys.stdin)
    except (OSError, InputTooLarge, yaml.YAMLError, UnicodeDecodeError):
        return [path]  # the loader says what is wrong with it, as for any rules file
    found = config_map_sources(documents, path)
    return [path] if found is None else found


_MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def _files_of(name: str) -> list[str]:
    """`name`, or the manifests of the folder it names (its .yaml, .yml and .json files in name
    order, not recursing, as kubectl -f reads a folder)."""
    path = Path(name)
    if name == "-" or not path.is_dir():
        return [name]
    found = sorted(str(p) for p in path.iterdir()
                   if p.suffix in _MANIFEST_SUFFIXES and p.is_file())
    if not found:
        raise ValueError(f"folder {name} holds no {', '.join(_MANIFEST_SUFFIXES)} file")
    return found


def _not_manifests(documents: list[Any]) -> str | None:
    """What keeps `documents` (one source's) from being Kubernetes manifests, None when they
    are: none at all, or a document without apiVersion and kind."""
    if not documents:
        return " holds no Kubernetes object (it is empty, or only comments)"
    for number, document in enumerate(documents, 1):
        if not isinstance(document, dict):
            return (f": document {number} is not a Kubernetes object: it is a "
                    f"{type(document).__name__}, not a mapping with apiVersion and kind")
        missing = [k for k in ("apiVersion", "kind") if not isinstance(document.get(k), str)
                   or not document.get(k)]
        if missing:
            return (f": document {number} is not a Kubernetes object: it has no "
                    f"{' and no '.join(missing)}")
    return None


def _read_stream(name: str, stdin: TextIO, progress: Progress | None = None) -> list[Any]:
    """The documents of file `name` (`-`: standard input), read by the one bounded loader;
    `InputTooLarge` past its size, `yaml.YAMLError` (`ExpansionError`) for what YAML refuses.
    `progress` hears how far the reading is."""
    import json

    from dra_gateway.translator import yamlinput

    limit = yamlinput.MAX_INPUT_BYTES
    if name == "-":
        # Decoded strictly as files are: a text stdin may decode with surrogateescape, and the
        # YAML parser would then blame an "unacceptable character" of its own making.
        raw = getattr(stdin, "buffer", None)
        data = raw.read(limit + 1) if raw is not None else stdin.read(limit + 1)
        yamlinput.check_size(data, "standard input")
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    else:
        with Path(name).open("rb") as file:
            data = file.read(limit + 1)
        yamlinput.check_size(data, name)
        text = data.decode("utf-8")
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            pass  # YAML flow style also starts with a bracket; let the YAML parser decide.
        else:
            return data if isinstance(data, list) else [data]
    if progress is None:
        return yamlinput.load_all(text)
    source = "standard input" if name == "-" else name

    def read(documents: int, fraction: float) -> None:
        progress.update(f"reading {source}: {fraction:.0%}, {documents:,} read")

    try:
        return yamlinput.load_all(text, read=read)
    finally:
        progress.done()  # before anything else is said about the file


def _run_translate(args: argparse.Namespace) -> int:
    import json

    import yaml

    from dra_gateway.kube import yamltext
    from dra_gateway.kube.progress import Progress
    from dra_gateway.translator.manifests import rewrite_manifests
    from dra_gateway.translator.rules import RulesError, load_rules
    from dra_gateway.translator.yamlinput import ExpansionError, InputTooLarge

    try:
        ruleset = load_rules(*args.rules, builtin=not args.no_builtin_rules)
    except RulesError as exc:
        return arguments.error(f"{exc}", EXIT_UNREADABLE)
    if args.filename.count("-") > 1:
        return arguments.error("-f - (standard input) can be given only once", EXIT_UNREADABLE)
    if (args.filename + args.device_classes).count("-") > 1:
        return arguments.error("- (standard input) can be given only once, to -f or to "
                               "--device-classes", EXIT_UNREADABLE)
    extended = _read_device_classes(args)
    if extended is None:
        return EXIT_UNREADABLE
    documents: list[Any] = []
    try:
        filenames = [f for given in args.filename for f in _files_of(given)]
    except ValueError as exc:
        return arguments.error(f"{exc}", EXIT_UNREADABLE)
    # A large input takes seconds to read and to write: a terminal is told how far it is.
    progress = Progress("translate")
    for filename in filenames:
        source = "standard input" if filename == "-" else filename
        try:
            read = _read_stream(filename, sys.stdin, progress)
        except OSError as exc:
            return arguments.error(f"cannot read {source}: {exc.strerror or exc}",
                                   EXIT_UNREADABLE)
        except InputTooLarge as exc:
            return arguments.error(f"{exc}", EXIT_UNREADABLE)
        except ExpansionError as exc:
            mark = exc.problem_mark
            where = f" at line {mark.line + 1}" if mark is not None else ""
            return arguments.error(f"{source} is refused{where}: {exc.problem}",
                                   EXIT_UNREADABLE)
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or exc
            return arguments.error(
                f"{source} is not valid YAML or JSON{where}: {problem}", EXIT_UNREADABLE)
        problem = _not_manifests(read)
        if problem is not None:
            return arguments.error(
                f"{source}{problem}; pass Kubernetes manifests, as kubectl apply -f "
                "takes them", EXIT_UNREADABLE)
        documents.extend(read)
    source = ", ".join("standard input" if f == "-" else f for f in args.filename)

    result = rewrite_manifests(documents, ruleset, extended=extended,
                               mig_shares=args.mig_shares)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for refusal in result.refusals:
        arguments.error(refusal, EXIT_REFUSED)
    if args.explain:
        _write_explanations(result, ruleset, output=args.output)
        return EXIT_REFUSED if result.refusals else EXIT_OK
    out = [*result.documents, *result.templates]
    if args.output == "json":
        try:
            # An explicitly tagged YAML value (`!!timestamp`) is written as its text.
            text = json.dumps(out, indent=2, default=str)
        except (TypeError, ValueError) as exc:  # e.g. a YAML mapping key that is a list
            return arguments.error(
                f"{source} holds a value JSON cannot represent ({exc}); use -o yaml",
                EXIT_UNREADABLE)
        sys.stdout.write(text + "\n")
    else:
        with progress:
            for written, document in enumerate(out, 1):
                sys.stdout.write(yamltext.dump_all([document], sort_keys=False,
                                                   explicit_start=True))
                progress.update(f"writing: {written:,} of {len(out):,} documents")
    return EXIT_REFUSED if result.refusals else EXIT_OK


def _write_explanations(result: ManifestResult, ruleset: RuleSet, *, output: str) -> None:
    """`translate --explain`: each pod spec's explanation, as text or (-o json) one JSON list;
    -o yaml is the text (a stream of manifests would not be an explanation)."""
    import json

    from dra_gateway.translator.explaining import explain
    from dra_gateway.translator.wording import render_text

    entries: list[dict[str, Any]] = []
    lines: list[str] = []
    for pod in result.pods:
        if pod.plan is None:
            entries.append({"where": pod.where, "outcome": "invalid", "problem": pod.problem})
            lines.append(f"{pod.where}: not a valid pod spec: the pod's {pod.problem}")
            continue
        explanation = explain(pod.pod, ruleset, plan=pod.plan)
        entries.append({"where": pod.where, **explanation.to_dict()})
        lines.extend(render_text(pod.where, explanation))
    if output == "json":
        sys.stdout.write(json.dumps(entries, indent=2) + "\n")
    else:
        sys.stdout.write("".join(line + "\n" for line in lines))
