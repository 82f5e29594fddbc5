"""The validating admission webhook for Configurations.

The pure parts are exported here: the AdmissionReview answer (validate), the OpenAPI schema
walk it uses (openapi), the handlers' details parsers (parsers) and the TLS material and
ValidatingWebhookConfiguration (certs). The edges, the HTTPS server (server) and the command
(cli), are not imported here, so using the cores never pulls in trio or the kube client.
"""

from akri_trio.model.limits import MAX_CAPACITY
from akri_trio.webhook.certs import (
    ServingCerts,
    service_dns_names,
    serving_certs,
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
    "Parser",
    "Schemas",
    "ServingCerts",
    "builtin_parser",
    "is_quantity",
    "review",
    "service_dns_names",
    "serving_certs",
    "validate_configuration",
    "webhook_configuration",
]
