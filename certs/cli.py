"""Subcommands of this component for the `dra-gateway` command (light imports only).

`certs generate --out DIR [--dns NAME]... [--ip ADDR]...` writes a CA and a serving
certificate; the webhook reloads them when they change.
"""

from __future__ import annotations

import argparse

from dra_gateway.kube import arguments


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this component's subcommands; handlers import their heavy modules themselves."""
    certs = sub.add_parser("certs", help="certificates for the webhooks",
                           description="Certificates for the webhooks: a CA and a serving "
                           "certificate the webhook reloads when they change.")
    actions = certs.add_subparsers(dest="certs_command", metavar="ACTION", required=True)
    generate = actions.add_parser(
        "generate", help="write ca.crt, tls.crt and tls.key (a CA and a serving certificate)",
        description="Write a new CA (ca.crt) and a serving certificate it signs (tls.crt, "
                    "tls.key) into --out, for the DNS names and addresses given.")
    generate.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    generate.add_argument("--dns", action="append", default=[], metavar="NAME",
                          help="DNS name in the certificate, e.g. dra-gateway.dra-gateway.svc "
                          "(repeatable)")
    generate.add_argument("--ip", action="append", default=[], metavar="ADDR",
                          help="IP address in the certificate (repeatable)")
    generate.add_argument("--days", type=int, default=90, metavar="DAYS",
                          help="validity of the serving certificate; renew it before 30 days "
                          "are left: the webhook reloads renewed files without a restart "
                          "(default: %(default)s, as cert-manager)")
    generate.add_argument("--ca-days", type=int, default=3650, metavar="DAYS",
                          help="validity of the CA (default: %(default)s)")
    generate.add_argument("--force", action="store_true",
                          help="replace a CA already in --out (what trusts the old one, such as "
                          "the webhook configurations' caBundle, must then be given the new "
                          "ca.crt)")
    generate.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    import datetime as dt
    from pathlib import Path

    from dra_gateway.certs.generate import CA_FILE, CERT_FILE, KEY_FILE, make_bundle, write_bundle

    if not args.dns and not args.ip:
        return arguments.error(
            "give at least one --dns NAME or --ip ADDR for the certificate's "
            "subject alternative names, e.g. --dns dra-gateway.dra-gateway.svc", 2)
    if args.days < 1 or args.ca_days < args.days:
        return arguments.error(f"--days {args.days} must be at least 1 and no more than "
                               f"--ca-days {args.ca_days}", 2)
    # X.509 dates end with the year 9999; a longer validity ended in an OverflowError trace.
    longest = (dt.datetime(9999, 12, 31, tzinfo=dt.UTC) - dt.datetime.now(dt.UTC)).days
    if args.ca_days > longest:
        return arguments.error(f"--ca-days {args.ca_days} would end after 9999-12-31, the last "
                               f"date a certificate can hold; give at most {longest}", 2)
    out = Path(args.out)
    if (out / CA_FILE).is_file() and not args.force:
        # The CA's key is never written: a second run makes a new CA, which nothing trusts yet.
        return arguments.error(
            f"{out / CA_FILE} exists; a new CA would not be trusted by what "
            f"trusts that one (the webhook configurations' caBundle, clients given it): pass "
            f"--force to replace {CA_FILE}, {CERT_FILE} and {KEY_FILE}, then give the new "
            f"{CA_FILE} to them, or choose another --out directory", 1)
    for name in (CA_FILE, CERT_FILE, KEY_FILE):
        # Refused before writing: one unwritable file left a new CA beside the old pair.
        if (out / name).exists() and not (out / name).is_file():
            return arguments.error(f"cannot write {out / name}: it exists and is not a file; "
                                   f"remove it or choose another --out directory", 1)
    try:
        bundle = make_bundle(dns_names=args.dns, ip_addresses=args.ip, days=args.days,
                             ca_days=args.ca_days)
        paths = write_bundle(bundle, out)
    except ValueError as exc:
        return arguments.error(f"{exc}", 2)
    except OSError as exc:
        return arguments.error(f"cannot write into {args.out}: {exc.strerror}; choose a "
                               f"writable --out directory", 1)
    print(f"wrote {paths.ca_cert}, {paths.cert} and {paths.key}")
    return 0
