"""The validating admission webhook for Configurations.

This package holds the pure parts: the AdmissionReview answer (validate), the OpenAPI schema
walk it uses (openapi), the handlers' details parsers (parsers) and the TLS material and
ValidatingWebhookConfiguration (certs). The HTTPS edge imports these names from here.
"""

from akri_trio.webhook.certs import (
    ServingCerts,
    service_dns_names,
    serving_certs,
    webhook_configuration,
)
from akri_trio.webhook.openapi import Schemas, is_quantity
from akri_trio.webhook.parsers import Parser, builtin_parser
from akri_trio.webhook.validate import (
    MAX_CAPACITY,
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
