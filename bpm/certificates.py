"""A participant's TLS certificate, as the registry keeps it and its partners pin it.

Each participant's agent (its HTTP API and its broker) serves TLS with a certificate of its
own; it registers the certificate with the registry, and a partner that connects trusts that
certificate and nothing else (`spark_agents.tls`): no certificate authority is needed, and a
participant's key never leaves its host. The operator may hand an agent a certificate of its
own CA instead; the registry keeps whatever leaf the agent serves.

`parse` is the one check of a certificate's text (the registry's, before it keeps one);
`self_signed` makes a participant's pair.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

PEM_MAX = 8192  # one certificate's text: a leaf with its names is well under 2 KiB
RSA_BITS_MIN = 2048
VALID_DAYS = 365


class CertificateError(ValueError):
    """The text is not one usable certificate (say why)."""


@dataclass(frozen=True)
class Certificate:
    pem: str  # the certificate alone, re-encoded
    sha256: str  # of its DER form, hex: what an operator compares by eye
    not_after: dt.datetime


def parse(text: str, *, now: dt.datetime | None = None) -> Certificate:
    """The single certificate in `text`, checked: PEM, one certificate, a key of a usable
    kind and size, valid now. Raises `CertificateError` naming what is wrong."""
    if len(text) > PEM_MAX:
        raise CertificateError(f"a certificate's PEM text is at most {PEM_MAX} characters")
    try:
        found = x509.load_pem_x509_certificates(text.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise CertificateError(f"not a PEM certificate: {exc}") from None
    if len(found) != 1:
        raise CertificateError(f"one certificate expected, not {len(found)} (the participant's own, without its chain)")
    cert = found[0]
    key = cert.public_key()
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < RSA_BITS_MIN:
        raise CertificateError(f"an RSA key of {key.key_size} bits is too short (at least {RSA_BITS_MIN})")
    if not isinstance(key, (rsa.RSAPublicKey, ec.EllipticCurvePublicKey, ed25519.Ed25519PublicKey)):
        raise CertificateError(f"a {type(key).__name__} key is not one TLS peers here accept (RSA, EC or Ed25519)")
    now = now or dt.datetime.now(dt.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise CertificateError(f"not valid now: valid from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    pem = cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
    return Certificate(pem, sha256(pem), cert.not_valid_after_utc)


def sha256(pem: str) -> str:
    """The SHA-256 of the DER form of a certificate `parse` returned (its PEM body decoded;
    no parse, so a registry listing many participants spends nothing on it)."""
    body = "".join(line for line in pem.splitlines() if line and not line.startswith("-----"))
    return hashlib.sha256(base64.b64decode(body)).hexdigest()


def hosts(pem: str) -> set[str]:
    """The addresses and DNS names a certificate names (its subject alternative names)."""
    cert = x509.load_pem_x509_certificate(pem.encode("ascii"))
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(a) for a in names.get_values_for_type(x509.IPAddress)} | set(names.get_values_for_type(x509.DNSName))


def self_signed(name: str, hosts: list[str], *, now: dt.datetime | None = None, days: int = VALID_DAYS,
                key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | None = None) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) for participant `name`, valid for `days` and naming
    `hosts` (addresses or DNS names), with `key` (a new P-256 key by default)."""
    now = now or dt.datetime.now(dt.UTC)
    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # hosts' clocks differ a little
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem
