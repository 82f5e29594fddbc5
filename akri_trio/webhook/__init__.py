"""The validating admission webhook for Configurations.

The pure parts are exported here: the AdmissionReview answer (validate), the OpenAPI schema
walk it uses (openapi), the handlers' details parsers (parsers) and the TLS material and
ValidatingWebhookConfiguration with when to renew the certificate (certs). The edges, the HTTPS
server (server), the certificate's keeper (rotation) and the command (cli), are not imported
here, so using the cores never pulls in trio or the kube client.
"""

from akri_trio.model.limits import MAX_CAPACITY
from akri_trio.webhook.certs import (
    CertSpec,
    ServingCerts,
    certs_of_secret,
    plan_certs,
    secret_data,
    service_dns_names,
    serving_certs,
    trusted_bundle,
    webhook_configuration,
)
from akri_trio.webhook.openapi import Schemas, is_quantity
from akri_trio.webhook.parsers import Parser, builtin_parser
from akri_trio.webhook.validate import (
    BadReview,
    review,
    validate_configuration,
)

__all__ = [
    "MAX_CAPACITY",
    "BadReview",
    "CertSpec",
    "Parser",
    "Schemas",
    "ServingCerts",
    "builtin_parser",
    "certs_of_secret",
    "is_quantity",
    "plan_certs",
    "review",
    "secret_data",
    "service_dns_names",
    "serving_certs",
    "trusted_bundle",
    "validate_configuration",
    "webhook_configuration",
]
