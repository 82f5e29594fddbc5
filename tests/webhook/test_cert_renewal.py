"""When the webhook's certificate is renewed (akri_trio.webhook.certs.plan_certs): kept while it
has more than a third of its validity left, re-signed by the same CA after (so the caBundle
stays), a new CA beside the old one in the bundle when the CA itself nears its end; and the
Secret holding it round-trips."""

from __future__ import annotations

import datetime as dt

import attrs
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from akri_trio.webhook.certs import (
    CA_VALIDITY_FACTOR,
    MAX_BUNDLE,
    CertSpec,
    certs_of_secret,
    plan_certs,
    secret_data,
    trusted_bundle,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
VALIDITY = dt.timedelta(days=30)
SPEC = CertSpec("hook", "akri", validity=VALIDITY)
HELD = SPEC.make(T0)


def _leaf(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_nothing_held_makes_a_ca_and_a_certificate() -> None:
    made = plan_certs(None, SPEC, T0)
    assert made is not None and made.ca_key_pem
    ca = _leaf(made.ca_pem)
    _leaf(made.cert_pem).verify_directly_issued_by(ca)
    assert ca.not_valid_after_utc - T0 == VALIDITY * CA_VALIDITY_FACTOR
    assert _leaf(made.cert_pem).not_valid_after_utc - T0 == VALIDITY


@settings(max_examples=30, deadline=None)
@given(st.floats(min_value=0, max_value=VALIDITY.total_seconds() * 2 / 3 - 1))
def test_kept_while_more_than_a_third_is_left(elapsed: float) -> None:
    now = T0 + dt.timedelta(seconds=elapsed)
    assert plan_certs(HELD, SPEC, now) is None


@settings(max_examples=30, deadline=None)
@given(
    st.floats(
        min_value=VALIDITY.total_seconds() * 2 / 3 + 1, max_value=VALIDITY.total_seconds() * 5
    )
)
def test_renewed_by_the_same_ca_once_a_third_is_left(elapsed: float) -> None:
    """Expired too: the CA (ten times as long) still signs, so the caBundle never changes."""
    now = T0 + dt.timedelta(seconds=elapsed)
    renewed = plan_certs(HELD, SPEC, now)
    assert renewed is not None
    assert renewed.ca_pem == HELD.ca_pem and renewed.ca_key_pem == HELD.ca_key_pem
    leaf = _leaf(renewed.cert_pem)
    leaf.verify_directly_issued_by(_leaf(HELD.ca_pem))
    assert abs((leaf.not_valid_after_utc - (now + VALIDITY)).total_seconds()) < 1
    assert plan_certs(renewed, SPEC, now) is None  # settled


def test_a_missing_name_renews_with_the_same_ca() -> None:
    renewed = plan_certs(HELD, attrs.evolve(SPEC, ips=("127.0.0.1",)), T0)
    assert renewed is not None and renewed.ca_pem == HELD.ca_pem
    sans = _leaf(renewed.cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert [str(ip) for ip in sans.value.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_a_ca_near_its_end_is_replaced_and_kept_in_the_bundle_beside_the_new() -> None:
    now = T0 + VALIDITY * CA_VALIDITY_FACTOR * 0.7
    new = plan_certs(HELD, SPEC, now)
    assert new is not None
    signing, previous = x509.load_pem_x509_certificates(new.ca_pem)
    assert previous == _leaf(HELD.ca_pem)
    _leaf(new.cert_pem).verify_directly_issued_by(signing)
    # the next renewal signs with the new CA, the first in the bundle
    later = plan_certs(new, SPEC, now + VALIDITY)
    assert later is not None
    _leaf(later.cert_pem).verify_directly_issued_by(signing)


def test_a_certificate_without_its_ca_key_is_made_anew() -> None:
    """cert-manager's Secret, or a user's: not ours to re-sign (the webhook then only reads)."""
    foreign = certs_of_secret({k: v for k, v in secret_data(HELD).items() if k != "ca.key"})
    assert foreign is not None and foreign.ca_key_pem == b""
    made = plan_certs(foreign, SPEC, T0)
    assert made is not None and made.ca_pem != HELD.ca_pem


def test_the_secret_round_trips() -> None:
    data = secret_data(HELD)
    assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert certs_of_secret(data) == HELD
    assert certs_of_secret({"ca.crt": data["ca.crt"]}) is None
    assert certs_of_secret({**data, "tls.key": "not base64!"}) is None
    assert certs_of_secret(None) is None


def _cas(bundle: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(bundle)


def test_the_bundle_gains_a_new_ca_keeping_the_ones_it_trusted() -> None:
    other = SPEC.make(T0)  # another CA: a Secret made anew, or an old chart's
    assert trusted_bundle(b"", HELD.ca_pem) == HELD.ca_pem
    assert trusted_bundle(HELD.ca_pem, HELD.ca_pem) is None  # trusted already: no write
    both = trusted_bundle(other.ca_pem, HELD.ca_pem)
    assert both is not None
    assert _cas(both) == [_leaf(HELD.ca_pem), _leaf(other.ca_pem)]  # the signing one first
    assert trusted_bundle(both, other.ca_pem) is None  # never shrinks while trusted
    many = both
    for _ in range(3):
        nxt = trusted_bundle(many, SPEC.make(T0).ca_pem)
        assert nxt is not None
        many = nxt
    assert len(_cas(many)) == MAX_BUNDLE
    assert trusted_bundle(b"garbage", HELD.ca_pem) == HELD.ca_pem
