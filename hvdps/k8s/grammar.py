"""What the cluster refuses of a text a manifest carries, refused first, by the grammars it applies.

- An image reference by the OCI distribution grammar (distribution/reference, which Docker,
  containerd and the kubelet parse): ``[HOST[:PORT]/]PATH[:TAG][@DIGEST]``, each path component
  lower-case letters and digits joined by ``.``, ``_``, ``__`` or dashes, a tag of at most 128
  word characters, ``.`` and ``-`` (not starting with either), the name at most 255 characters.
- An object name or namespace by RFC 1123's label, as the API server checks it (lower-case ASCII
  letters, digits and ``-``, starting and ending with a letter or digit, at most 63 characters).
- A quantity by Kubernetes' ``resource.Quantity`` grammar (a decimal number, then a binary or
  decimal SI suffix or an exponent), and greater than zero where a request or a claim's size is.
- A Kubernetes version that kubernetes-validate has schemas for.

Each returns the one line that names the flag, or nothing.
"""
import re
from decimal import Decimal, InvalidOperation

_ALNUM = r"[a-z0-9]+"
_PATH = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_HOST}/)?{_PATH}(?:/{_PATH})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?")
NAME_MAX = 255

DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")

_QUANTITY = re.compile(r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?")
_SCALE = {None: 1, "m": Decimal("0.001"), "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15,
          "E": 10 ** 18, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}


def image_problem(flag, text):
    """Why ``text`` is not an image the cluster pulls as this comparison's (a reference pinned by a tag
    other than ``latest``, or by a digest), or None."""
    m = REFERENCE.fullmatch(text)
    if not m:
        lower = REFERENCE.fullmatch(text.lower()) if text.isascii() else None
        why = ("a repository name is lower-case" if lower else
               "not an image reference: [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST], each part of NAME lower-case "
               "letters and digits joined by '.', '_' or '-', a TAG of letters, digits, '_', '.' and '-'")
        return f"{flag} {text!r}: {why}"
    if len(m.group("name")) > NAME_MAX:
        return f"{flag} {text!r}: the repository name is {len(m.group('name'))} characters, more than {NAME_MAX}"
    if not m.group("tag") and not m.group("digest") or m.group("tag") == "latest" and not m.group("digest"):
        return (f"{flag} {text!r}: name it with its tag (REGISTRY/NAME:TAG, not :latest) or its digest "
                f"(NAME@sha256:...), so that every pod runs the same image")
    return None


def label_problem(flag, text):
    """Why ``text`` is not an RFC 1123 label (a namespace, a claim's name), or None."""
    if DNS_LABEL.fullmatch(text):
        return None
    return (f"{flag} {text!r}: not a DNS label (RFC 1123: at most 63 lower-case letters, digits and '-', starting "
            f"and ending with a letter or digit)")


def quantity_of(text):
    """``text`` as a Kubernetes quantity's value (a Decimal), or None if the grammar refuses it."""
    m = _QUANTITY.fullmatch(text)
    if not m:
        return None
    try:
        number, suffix = Decimal(m.group("number")), m.group("suffix")
        if suffix and suffix[0] in "eE":
            return number.scaleb(int(suffix[1:]))
        return number * _SCALE[suffix]
    except (InvalidOperation, ValueError, OverflowError):
        return None


def quantity_problem(flag, text, example, least=0):
    """Why ``text`` is not a Kubernetes quantity greater than ``least`` (0: any positive amount), or None."""
    value = quantity_of(text)
    if value is None:
        return f"{flag} {text!r}: not a Kubernetes quantity (a number and a suffix such as {example})"
    if not value > least:
        return f"{flag} {text!r}: must be more than {least or 'zero'}"
    return None


def version_problem(flag, text, versions):
    """Why ``text`` is not 1.MINOR.PATCH of a minor that ``versions`` (kubernetes-validate's) hold, or None."""
    minors = sorted({int(v.split(".")[1]) for v in versions if re.fullmatch(r"1\.[0-9]+\.[0-9]+", v)})
    m = re.fullmatch(r"1\.([0-9]+)\.([0-9]+)", text)
    if not m or not minors or int(m.group(1)) not in range(minors[0], minors[-1] + 1):
        span = f"1.{minors[0]} to 1.{minors[-1]}" if minors else "none"
        return f"{flag} {text!r}: expected 1.MINOR.PATCH of a version the manifests are checked against ({span})"
    return None
