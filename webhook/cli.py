"""Subcommands of this component for the `dra-gateway` command (light imports only).

`webhook` serves /mutate and /validate over TLS; `webhook-config` prints the Mutating- and
ValidatingWebhookConfiguration for the loaded rules as YAML.
"""

from __future__ import annotations

import argparse
import sys

from dra_gateway.kube import arguments, names
from dra_gateway.webhook.settings import POD_OPT_OUT_SCOPES, WebhookSettings

# The flags' defaults are the settings' own: one home for each.
_DEFAULTS = WebhookSettings()


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not HOST:PORT, e.g. 0.0.0.0:8443 or [::]:8443")
    return host.strip("[]") or "0.0.0.0", int(port)


def _service(value: str) -> tuple[str, str]:
    # Namespace and Service names are DNS labels; the API server would refuse the printed
    # configurations otherwise.
    namespace, sep, name = value.partition("/")
    label = arguments.DNS_LABEL.match
    if not sep or not label(namespace) or not label(name):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not NAMESPACE/NAME of the webhook's Service (two DNS labels), e.g. "
            f"dra-gateway/dra-gateway-webhook")
    return namespace, name


def _port(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number from 1 to 65535")
    return int(value)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this component's subcommands; handlers import their heavy modules themselves."""
    serve = sub.add_parser("webhook", help="serve the admission webhooks over TLS",
                           description="Serve /mutate and /validate over TLS: translate pods' "
                           "legacy GPU requests into DRA claims and enforce the GPU policies.")
    serve.add_argument("--listen", type=_listen, default=("0.0.0.0", 8443), metavar="HOST:PORT",
                       help="address to serve on (default: 0.0.0.0:8443)")
    serve.add_argument("--probe-listen", type=_listen, metavar="HOST:PORT",
                       help="also serve /healthz, /readyz and /metrics in plain HTTP here, apart "
                       "from the admission port (needed with --client-ca: probes and Prometheus "
                       "carry no client certificate), e.g. 0.0.0.0:8080")
    serve.add_argument("--tls-dir", required=True, metavar="DIR",
                       help="folder with tls.crt and tls.key (reloaded when they change)")
    serve.add_argument("--rules", action="append", default=[], metavar="PATH",
                       help="rules file or folder, added to the built-in rules (repeatable; "
                       "reloaded when it changes)")
    serve.add_argument("--no-builtin-rules", action="store_true",
                       help="do not load the built-in rule sets")
    serve.add_argument("--cluster", choices=("kube", "memory"), default="kube",
                       help="kube: the kubeconfig's cluster (default); memory: in-process")
    arguments.kubeconfig_option(serve)
    arguments.namespace_option(serve, default=names.GATEWAY_NAMESPACE,
                               help="the gateway's namespace: rule ConfigMaps are read there "
                               "(default: %(default)s)")
    serve.add_argument("--no-config-maps", action="store_true",
                       help="do not read rules from ConfigMaps")
    serve.add_argument("--no-device-classes", action="store_true",
                       help="do not watch DeviceClasses: translate legacy names even where a "
                       "DeviceClass declares them as spec.extendedResourceName (for "
                       "kube-scheduler to serve)")
    serve.add_argument("--no-policies", action="store_true",
                       help="do not watch GPUQuotas, GPUSharingPolicies and the gateway "
                       "driver's ResourceSlices: /validate checks only the gateway's own "
                       "contract (the allocator still enforces them)")
    serve.add_argument("--client-ca", metavar="FILE",
                       help="require client certificates signed by this CA on the admission "
                       "port (the API server's, from its AdmissionConfiguration kubeConfigFile); "
                       "serve probes with --probe-listen")
    serve.add_argument("--ca-file", metavar="FILE",
                       help="CA to inject as caBundle into the webhook configurations")
    serve.add_argument("--no-reconcile", action="store_true",
                       help="do not update the webhook configurations' matchConditions")
    serve.add_argument("--no-enforce", action="store_true",
                       help="let pods whose legacy GPU requests escaped translation through "
                       "/validate")
    serve.add_argument("--review-deadline", type=arguments.positive_duration,
                       default=_DEFAULTS.review_deadline, metavar="DURATION",
                       help=arguments.duration_help(
                           "longest one review may take, API reads included; keep it below "
                           "the webhook configurations' timeoutSeconds, at most 30s",
                           _DEFAULTS.review_deadline))
    serve.add_argument("--pod-opt-out", choices=POD_OPT_OUT_SCOPES,
                       default=_DEFAULTS.pod_opt_out,
                       help="where a pod's own annotation dra-gateway.io/translation: disabled "
                       "(or audit) keeps it legacy in an enabled namespace: labelled (default: "
                       "only in namespaces labelled dra-gateway.io/pod-opt-out=allowed, read "
                       "through the policies' watch of Namespaces; elsewhere it is refused) or "
                       "everywhere")
    serve.add_argument("--gated-event-after", type=arguments.duration,
                       default=_DEFAULTS.gated_event_after,
                       metavar="DURATION",
                       help=arguments.duration_help(
                           "post a Warning Event AllocatorUnavailable on each pod still gated by "
                           "dra-gateway.io/allocation after this long while the allocator's "
                           "Lease has had no valid holder for as long, once per pod and outage; "
                           "0: off, and neither the Lease nor pods are watched",
                           _DEFAULTS.gated_event_after))
    serve.add_argument("--workers", type=int, default=1, metavar="COUNT",
                       help="server processes sharing the port (SO_REUSEPORT; default: 1)")
    serve.add_argument("--log-level", default="info", type=str.lower,
                       choices=("debug", "info", "warning", "error"),
                       help="least severe level logged, in any case (default: %(default)s)")
    serve.set_defaults(func=_serve)

    config = sub.add_parser("webhook-config",
                            help="print the webhook configurations for the rules as YAML",
                            description="Print the Mutating- and ValidatingWebhookConfiguration "
                            "the loaded rules need, as YAML, for kubectl apply -f -.")
    config.add_argument("--service", type=_service, required=True, metavar="NAMESPACE/NAME",
                        help="namespace and name of the webhook's Service")
    config.add_argument("--ca-file", required=True, metavar="FILE",
                        help="CA certificate (PEM) that signed the serving certificate")
    config.add_argument("--rules", action="append", default=[], metavar="PATH",
                        help="rules file or folder, added to the built-in rules (repeatable)")
    config.add_argument("--no-builtin-rules", action="store_true",
                        help="derive the configurations from the --rules files only")
    arguments.namespace_option(config, default=None,
                               help="the gateway's namespace, excluded from admission (default: "
                               "the Service's)")
    config.add_argument("--port", type=_port, default=443, metavar="PORT",
                        help="Service port (default: 443)")
    config.add_argument("--default-translation", choices=("enabled", "audit"), default="enabled",
                        help="translation mode of namespaces without the label "
                        "dra-gateway.io/translation (default: %(default)s)")
    config.set_defaults(func=_config)


def _serve(args: argparse.Namespace) -> int:
    import logging
    from pathlib import Path

    from dra_gateway.certs.tls import TlsFilesError
    from dra_gateway.kube.cluster.connect import ClusterConfigError
    from dra_gateway.translator.rules import RulesError
    from dra_gateway.webhook.server import ServeOptions, run
    from dra_gateway.webhook.settings import WebhookSettings

    tls_dir = Path(args.tls_dir)
    if tls_dir.exists() and not tls_dir.is_dir():
        # `certs generate --out` would fail on it too: do not suggest it.
        return arguments.error(
            f"--tls-dir {tls_dir} is a file; pass the folder that holds tls.crt and "
            "tls.key", 2)
    missing = [f for f in ("tls.crt", "tls.key") if not (tls_dir / f).is_file()]
    if missing:
        return arguments.error(
            f"{' and '.join(missing)} not found in --tls-dir {tls_dir}; create them "
            f"with `dra-gateway certs generate --out {tls_dir} --dns NAME`", 2)
    if args.ca_file and not Path(args.ca_file).is_file():
        return arguments.error(f"--ca-file {args.ca_file} not found; pass the ca.crt written by "
                               f"`dra-gateway certs generate`, or leave --ca-file out", 2)
    if not 0 < args.review_deadline <= 30:
        return arguments.error(
            f"--review-deadline {args.review_deadline:g} must be above 0 and at most "
            "30 (the longest timeoutSeconds a webhook configuration takes)", 2)
    if args.workers < 1:
        return arguments.error(f"--workers {args.workers} must be at least 1", 2)
    host, port = args.listen
    if args.workers > 1 and (port == 0 or args.cluster == "memory"):
        return arguments.error(
            "--workers above 1 needs a fixed --listen port and --cluster kube (each "
            "worker would otherwise serve its own port or its own in-memory cluster)", 2)
    settings = WebhookSettings(
        namespace=args.namespace,
        rules_paths=tuple(Path(p) for p in args.rules),
        builtin_rules=not args.no_builtin_rules,
        watch_config_maps=not args.no_config_maps,
        watch_device_classes=not args.no_device_classes,
        watch_policies=not args.no_policies,
        tls_dir=tls_dir,
        ca_file=Path(args.ca_file) if args.ca_file else None,
        enforce=not args.no_enforce,
        reconcile_webhooks=not args.no_reconcile,
        review_deadline=args.review_deadline,
        template_timeout=min(2.0, args.review_deadline / 2),
        gated_event_after=args.gated_event_after,
        pod_opt_out=args.pod_opt_out,
    )
    options = ServeOptions(
        host=host, port=port, cluster=args.cluster, kubeconfig=args.kubeconfig,
        client_ca=Path(args.client_ca) if args.client_ca else None, workers=args.workers,
        probe_host=args.probe_listen[0] if args.probe_listen else "0.0.0.0",
        probe_port=args.probe_listen[1] if args.probe_listen else None,
        log_level=getattr(logging, args.log_level.upper()),
    )
    try:
        return run(settings, options)
    except RulesError as exc:
        return arguments.error(f"{exc}", 2)
    except (ClusterConfigError, TlsFilesError) as exc:
        return arguments.error(f"{exc}", 2)
    except OSError as exc:
        return arguments.error(f"cannot serve on {host}:{port}: {exc.strerror}", 1)


def _config(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dra_gateway.kube import yamltext
    from dra_gateway.translator.rules import RulesError, load_rules
    from dra_gateway.webhook.config import configurations

    try:
        ca_bundle = Path(args.ca_file).read_bytes()
    except OSError as exc:
        return arguments.error(f"cannot read --ca-file {args.ca_file}: {exc.strerror}", 2)
    if b"-----BEGIN CERTIFICATE-----" not in ca_bundle:
        return arguments.error(f"--ca-file {args.ca_file} holds no PEM certificate; pass the "
                               f"ca.crt written by `dra-gateway certs generate`", 2)
    try:
        rules = load_rules(*args.rules, builtin=not args.no_builtin_rules)
    except RulesError as exc:
        return arguments.error(f"{exc}", 2)
    namespace, name = args.service
    documents = configurations(rules, service_namespace=namespace, service_name=name,
                               ca_bundle=ca_bundle, gateway_namespace=args.namespace or namespace,
                               port=args.port, default_translation=args.default_translation)
    sys.stdout.write(yamltext.dump_all(documents, sort_keys=False, width=100))
    return 0
