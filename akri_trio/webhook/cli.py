"""`akri-trio webhook`: the admission webhook's HTTPS server; `akri-trio webhook certs`: its TLS
material and its registration.

The API server only calls webhooks over HTTPS it can verify, so the webhook cannot start
without a serving certificate and the API server cannot use it without the matching CA in the
ValidatingWebhookConfiguration. `certs` makes both at once from the Service's name (a fresh CA,
a certificate for the Service's DNS names, the configuration with that CA as its caBundle),
so installing needs no cert-manager and no openssl. The TLS files and the kube config are read
before the server starts: a wrong path fails the command at once instead of a probe later.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import logging
import os
import ssl
import sys
from pathlib import Path

import trio
import yaml

from akri_trio.address import ObjectKey
from akri_trio.flaghelp import (
    Parser,
    add_env_argument,
    add_kubeconfig_argument,
    add_log_arguments,
    comma_list,
)
from akri_trio.kube import Client, ConfigError, KubeConfig, load_config
from akri_trio.runtime.logs import log_startup, setup_logging
from akri_trio.shutdown import run_until_signalled
from akri_trio.webhook.certs import VALIDITY, CertSpec, webhook_configuration
from akri_trio.webhook.rotation import (
    CHECK_PERIOD_S,
    Managed,
    SecretKeeper,
    Source,
    files_source,
    keep_serving_cert,
)
from akri_trio.webhook.server import (
    IDLE_TIMEOUT,
    MAX_CONNECTIONS,
    REQUEST_TIMEOUT,
    run_webhook,
    server_ssl_context,
)
from akri_trio.webhook.validate import parse_handler_namespaces

log = logging.getLogger("akri_trio.webhook")

CONFIGURATION_NAME = "akri-webhook-configuration.akri.sh"
CERTS_FILES = ("ca.crt", "tls.crt", "tls.key", "validatingwebhookconfiguration.yaml")


def _add_cert_arguments(p: argparse.ArgumentParser, prefix: str) -> None:
    """PREFIXip, PREFIXdns (repeatable) and PREFIXdays: a certificate's extra names and its
    validity, for `certs` (prefix `--`) and for the server's own (`--cert-`)."""
    p.add_argument(
        f"{prefix}ip", action="append", default=[], help="an extra IP the cert is valid for"
    )
    p.add_argument(
        f"{prefix}dns", action="append", default=[], help="an extra DNS name for the cert"
    )
    p.add_argument(
        f"{prefix}days",
        type=float,
        default=VALIDITY.days,
        help="the certificate's validity, renewed by the server with a third left (the CA's "
        "is ten times as long)",
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["certs"]:
        return certs(argv[1:])
    return serve(argv)


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(
        prog="akri-trio webhook",
        description="Validate Configurations for the API server over HTTPS "
        "(`akri-trio webhook certs --help` makes the TLS files).",
    )
    p.add_argument(
        "--tls-cert-file", type=Path, help="serving certificate (PEM; re-read when it changes)"
    )
    p.add_argument("--tls-key-file", type=Path, help="its private key (PEM)")
    p.add_argument(
        "--tls-secret",
        metavar="NAME",
        help="serve the certificate of this kubernetes.io/tls Secret in --namespace instead of "
        "files (followed as it changes)",
    )
    add_env_argument(
        p,
        "--namespace",
        env=os.environ,
        var="POD_NAMESPACE",
        default="",
        help="the Secret's namespace, also the Service's",
    )
    p.add_argument(
        "--manage-certs",
        action="store_true",
        help="make the --tls-secret certificate and its CA when missing, renew it before it "
        "expires, and keep --webhook-configuration's caBundle on that CA",
    )
    p.add_argument("--webhook-configuration", metavar="NAME", help="its caBundle (--manage-certs)")
    p.add_argument("--service", metavar="NAME", help="the Service the certificate names")
    _add_cert_arguments(p, "--cert-")
    p.add_argument(
        "--cert-check-period",
        type=float,
        default=CHECK_PERIOD_S,
        help="seconds between looks at the certificate's source",
    )
    p.add_argument("--port", type=int, default=8443, help="0 picks a free port (logged)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    add_kubeconfig_argument(p)
    p.add_argument(
        "--request-timeout",
        type=float,
        default=REQUEST_TIMEOUT,
        help="seconds a review may take, reading the request included",
    )
    add_env_argument(
        p,
        "--handler-namespace",
        env=os.environ,
        var="AKRI_HANDLER_NAMESPACES",
        from_env=comma_list,
        action="append",
        dest="handler_namespaces",
        default=[],
        metavar="HANDLER:NAMESPACE",
        help="restrict a discovery handler to the namespaces named for it: a Configuration "
        "using HANDLER in another namespace is refused (repeatable; the env var takes a list; "
        "default: none, every handler in every namespace)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=IDLE_TIMEOUT,
        help="seconds a connection may wait for its next request (the TLS handshake included)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=MAX_CONNECTIONS,
        help="connections served at once (at most a quarter of the file descriptor limit); "
        "one more takes the place of an idle or slow one, else is closed",
    )
    add_log_arguments(p, os.environ)
    args = p.parse_args(argv)
    try:
        args.handler_namespaces = parse_handler_namespaces(args.handler_namespaces)
    except ValueError as exc:
        p.error(f"--handler-namespace: {exc}")
    files = (args.tls_cert_file is not None, args.tls_key_file is not None)
    if args.tls_secret is None and files != (True, True):
        p.error("give --tls-cert-file and --tls-key-file, or --tls-secret")
    if args.tls_secret is not None and any(files):
        p.error("--tls-secret and --tls-cert-file/--tls-key-file exclude each other")
    if args.tls_secret is not None and not args.namespace:
        p.error("--tls-secret needs --namespace (or POD_NAMESPACE)")
    if args.manage_certs and not (args.tls_secret and args.webhook_configuration and args.service):
        p.error("--manage-certs needs --tls-secret, --webhook-configuration and --service")
    if not args.cert_days > 0 or not args.cert_check_period > 0:
        p.error("--cert-days and --cert-check-period must be positive")
    return args


def _source(args: argparse.Namespace, api: Client) -> Source:
    if args.tls_secret is None:
        return files_source(args.tls_cert_file, args.tls_key_file)
    manage = None
    if args.manage_certs:
        spec = CertSpec(
            args.service,
            args.namespace,
            dns=tuple(args.cert_dns),
            ips=tuple(args.cert_ip),
            validity=dt.timedelta(days=args.cert_days),
        )
        manage = Managed(spec, args.webhook_configuration)
    return SecretKeeper(api, ObjectKey(args.namespace, args.tls_secret), manage).read


async def _run(args: argparse.Namespace, kube: KubeConfig, context: ssl.SSLContext) -> None:
    """The certificate first (the server has nothing to serve before), then the server."""
    async with Client.open(kube) as api, trio.open_nursery() as nursery:
        await nursery.start(
            functools.partial(
                keep_serving_cert, context, _source(args, api), period=args.cert_check_period
            )
        )
        await run_webhook(
            kube,
            context,
            args.host,
            args.port,
            request_timeout=args.request_timeout,
            handler_namespaces=args.handler_namespaces,
            idle_timeout=args.idle_timeout,
            max_connections=args.max_connections,
        )


def serve(argv: list[str]) -> int:
    args = parse_serve_args(argv)
    try:
        context = server_ssl_context(args.tls_cert_file, args.tls_key_file)
        kube = load_config(args.kubeconfig, context=args.context)
    except (OSError, ConfigError) as exc:  # ssl.SSLError is an OSError
        print(f"akri-trio webhook: {exc}", file=sys.stderr)
        return 1
    setup_logging(args.log_level, args.log_format)
    log_startup(log, "webhook", vars(args))
    trio.run(run_until_signalled, functools.partial(_run, args, kube, context), log)
    log.info("webhook stopped")
    return 0


def certs(argv: list[str]) -> int:
    p = Parser(
        prog="akri-trio webhook certs",
        description="Write a fresh CA, a serving certificate for the webhook's Service and the "
        f"ValidatingWebhookConfiguration into DIR ({', '.join(CERTS_FILES)}); print the "
        "configuration.",
    )
    p.add_argument("--service", required=True, help="the webhook's Service name")
    p.add_argument("--namespace", required=True, help="the Service's namespace")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write them")
    p.add_argument("--port", type=int, default=443, help="the Service's port")
    p.add_argument("--name", default=CONFIGURATION_NAME, help="the configuration's name")
    p.add_argument(
        "--url",
        default=None,
        help="register the webhook at this URL instead of through the Service (default: "
        "through the Service)",
    )
    _add_cert_arguments(p, "--")
    args = p.parse_args(argv)
    if not args.days > 0:
        p.error("--days must be positive")
    spec = CertSpec(args.service, args.namespace, args.dns, args.ip, dt.timedelta(days=args.days))
    made = spec.make(dt.datetime.now(dt.UTC))
    if args.url:
        configuration = webhook_configuration(args.name, made.ca_pem, url=args.url)
    else:
        service = (args.service, args.namespace)
        configuration = webhook_configuration(
            args.name, made.ca_pem, service=service, port=args.port
        )
    text = yaml.safe_dump(configuration, sort_keys=False)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ca.crt").write_bytes(made.ca_pem)
    (args.out / "tls.crt").write_bytes(made.cert_pem)
    key = args.out / "tls.key"
    key.touch(mode=0o600)
    key.chmod(0o600)  # an existing file keeps its mode through touch
    key.write_bytes(made.key_pem)
    (args.out / "validatingwebhookconfiguration.yaml").write_text(text)
    print(text, end="")
    return 0
