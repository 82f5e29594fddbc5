"""Upstream Akri's udev rule subset: parse a rule once, then match it against plain device data.

Configurations written for upstream must select the same devices here, so this follows what
upstream's udev handler really does, quirks included, rather than what udev(7) says a rule
means. Upstream hands `==` on DEVPATH/KERNEL/TAG/SUBSYSTEM/ATTR/ENV and `!=` on ATTR/SUBSYSTEM
to the libudev enumerator, which compares with fnmatch(3) globs, and post-filters everything
else with a regex that must span the whole value; the plural fields (KERNELS, SUBSYSTEMS,
DRIVERS, ATTRS, TAGS) look at the device and all its ancestors. The enumerator ORs the values
of one kind (two `KERNEL==` accept either name; any one `ENV{}==` pair is enough) and ANDs
different attribute keys; we do the same. Two deliberate departures: `DEVPATH==` is a glob on
the devpath (upstream calls `add_syspath`, which a later scan discards, so the rule selects
every device), and `TAG==` globs where libudev compares tags exactly (the same for any tag
name without `*?[`).

Nothing here touches /sys: a `DeviceSnapshot` is plain data (the I/O edge in `udev.py` builds
it from pyudev), so every rule can be checked against hand-made device trees. Unlike upstream,
which panics on a bad regex at discovery time, every value is compiled here, at parse time, so
a bad rule is rejected by the webhook with the rule, the token and the reason.

Rules come from whoever may write a Configuration, and device data from whatever is plugged
in: regexes and globs alike compile to RE2 (`linear_regex`), so matching is linear in the
device's text, and the glob translator itself is one pass over the pattern. A rule is at most
`MAX_RULE_LENGTH` characters by default (the udev handler's setting).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Final, Literal

import attrs

from akri_trio.discovery.linear_regex import NOTHING, Regex, RegexError, literal

# Fields the subset supports: the ones that take a {key}, and the ones that must not.
KEYED_FIELDS: Final = frozenset({"ATTR", "ATTRS", "ENV"})
PLAIN_FIELDS: Final = frozenset(
    {"DEVPATH", "KERNEL", "KERNELS", "SUBSYSTEM", "SUBSYSTEMS", "DRIVER", "DRIVERS", "TAG", "TAGS"}
)
SUPPORTED_FIELDS: Final = KEYED_FIELDS | PLAIN_FIELDS
# Real udev(7) keys outside the subset: named in errors so a user knows the key is real but
# meaningless for discovery (they act, or need a running udevd), not misspelt.
UDEV_ONLY_FIELDS: Final = frozenset(
    {
        "ACTION",
        "CONST",
        "GOTO",
        "GROUP",
        "IMPORT",
        "LABEL",
        "MODE",
        "NAME",
        "OPTIONS",
        "OWNER",
        "PROGRAM",
        "RESULT",
        "RUN",
        "SECLABEL",
        "SYMLINK",
        "SYSCTL",
        "TEST",
    }
)
ASSIGNMENTS: Final = ("=", "+=", "-=", ":=")
# Real rules are a line or two; this leaves room for long alternations of device names.
MAX_RULE_LENGTH: Final = 4096
# How much of a bad token an error message quotes.
_SHOWN: Final = 80

# What the enumerator does with a (field, op): "glob" = must match, "noglob" = must not match.
_ENUMERATOR_MATCH: Final = frozenset({"DEVPATH", "KERNEL", "TAG", "SUBSYSTEM", "ATTR", "ENV"})
_ENUMERATOR_NOMATCH: Final = frozenset({"ATTR", "SUBSYSTEM"})

Mode = Literal["glob", "noglob", "regex"]


class RuleError(ValueError):
    """A rule that cannot be used. `token` is 1-based (None: the rule as a whole)."""

    def __init__(self, token: int | None, text: str, problem: str) -> None:
        self.token = token
        self.text = text
        self.problem = problem
        where = f"token {token} `{text}`: " if token is not None else ""
        super().__init__(f"{where}{problem}")


# ---- device data ---------------------------------------------------------------------------------


@attrs.frozen
class DeviceSnapshot:
    """What matching needs to know about one device, read from sysfs (and /run/udev if any).

    `attributes` holds only the sysfs attributes the rules ask about (missing = unreadable or
    absent); `properties` are the udev properties (ENV); `parent` is the next device up the
    sysfs tree, whether or not it was enumerated itself."""

    devpath: str
    sys_name: str
    subsystem: str | None = None
    driver: str | None = None
    devnode: str | None = None
    attributes: Mapping[str, str] = attrs.field(factory=dict)
    properties: Mapping[str, str] = attrs.field(factory=dict)
    tags: frozenset[str] = frozenset()
    parent: DeviceSnapshot | None = None
    iommu_group: str | None = None  # read only when VFIO passthrough asks for it

    def lineage(self) -> Iterator[DeviceSnapshot]:
        """This device, then each ancestor, nearest first."""
        device: DeviceSnapshot | None = self
        while device is not None:
            yield device
            device = device.parent


# ---- patterns ------------------------------------------------------------------------------------

_CLASSES: Final = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "blank": " \\t",
    "digit": "0-9",
    "lower": "a-z",
    "space": " \\t\\n\\r\\f\\v",
    "upper": "A-Z",
    "xdigit": "0-9A-Fa-f",
}
_LONGEST_CLASS: Final = max(map(len, _CLASSES))


def glob_to_regex(pattern: str) -> str:
    """fnmatch(3) with flags 0, as libudev calls it, as an RE2 regex to `fullmatch`:
    `*` and `?` match any character including `/` and a leading dot, `[...]` / `[!...]` /
    `[^...]` sets with ranges and a few POSIX classes, and a backslash quotes the next
    character. Raises GlobError for a malformed pattern (an unclosed `[`, a trailing
    backslash), on which glibc's own behaviour is erratic: a rule with one is refused.
    Linear in the pattern: every character is looked at a bounded number of times."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\":
            if i == n:
                raise GlobError("ends in a lone backslash")
            out.append(literal(pattern[i]))
            i += 1
        elif c == "[":
            regex, i = _bracket(pattern, i)
            out.append(regex)
        else:
            out.append(literal(c))
    return "".join(out)


class GlobError(ValueError):
    pass


def _bracket(pattern: str, i: int) -> tuple[str, int]:
    """The set starting just after a `[` at `i`: (regex, index after its `]`)."""
    n = len(pattern)
    negate = i < n and pattern[i] in "!^"
    if negate:
        i += 1
    items: list[str] = []  # regex pieces inside the class
    first = True
    while i < n:
        c = pattern[i]
        if c == "]" and not first:
            body = "".join(items)
            if not body:  # e.g. only reversed ranges: matches nothing (negated: anything)
                return ("." if negate else NOTHING), i + 1
            return f"[{'^' if negate else ''}{body}]", i + 1
        first = False
        if c == "[" and pattern.startswith(":", i + 1):
            # Bounded look-ahead: the longest class name is 6 characters. An unbounded
            # search made `[[:[[:[[:...` quadratic.
            end = pattern.find(":]", i + 2, i + 2 + _LONGEST_CLASS + 2)
            name = pattern[i + 2 : end] if end != -1 else ""
            if name in _CLASSES:
                items.append(_CLASSES[name])
                i = end + 2
                continue
        if c == "\\" and i + 1 < n:
            i += 1
            c = pattern[i]
        if i + 2 < n and pattern[i + 1] == "-" and pattern[i + 2] != "]":  # a range `lo-hi`
            hi_index = i + 2
            hi = pattern[hi_index]
            if hi == "\\" and hi_index + 1 < n:
                hi_index += 1
                hi = pattern[hi_index]
            if c <= hi:
                items.append(f"{literal(c)}-{literal(hi)}")
            i = hi_index + 1
            continue
        items.append(literal(c))
        i += 1
    raise GlobError("has an unclosed [")


@attrs.frozen
class Filter:
    """One `FIELD{key} op "value"` of a rule, with its value compiled for how it is matched."""

    field: str
    key: str | None
    negate: bool  # op is `!=`
    value: str
    mode: Mode
    pattern: Regex = attrs.field(eq=False, repr=False)
    # ENV{key}==: libudev globs the property name too.
    key_pattern: Regex | None = attrs.field(default=None, eq=False, repr=False)

    def test(self, text: str) -> bool:
        """Does `text` match the value (ignoring `negate`)?"""
        if self.mode == "regex":
            # Upstream: the leftmost-first match must span the whole value (Rust `find`),
            # which is not always `fullmatch` (`a|ab` does not match "ab").
            return self.pattern.spans_whole(text)
        return self.pattern.fullmatch(text)


@attrs.frozen
class UdevRule:
    text: str
    filters: tuple[Filter, ...]


def mode_for(field: str, negate: bool) -> Mode:
    if not negate and field in _ENUMERATOR_MATCH:
        return "glob"
    if negate and field in _ENUMERATOR_NOMATCH:
        return "noglob"
    return "regex"


# ---- parsing -------------------------------------------------------------------------------------

_TOKEN: Final = re.compile(
    r"""\s*(?P<field>[A-Za-z_][A-Za-z0-9_]*)
        (?:\{(?P<key>[^}]*)\})?
        \s*(?P<op>==|!=|\+=|-=|:=|=)
        \s*"(?P<value>(?:[^"\\]|\\.)*)"
        \s*""",
    re.VERBOSE | re.DOTALL,
)


def parse_rule(text: str, *, max_length: int = MAX_RULE_LENGTH) -> UdevRule:
    """Parse one rule: `FIELD op "value"` tokens separated by commas. Raises RuleError, also
    for a rule longer than `max_length` characters."""
    if len(text) > max_length:
        raise RuleError(
            None, text[:_SHOWN], f"is {len(text)} characters long; the limit is {max_length}"
        )
    if not text.strip():
        # Upstream would enumerate every device on the node; almost surely not what was meant.
        raise RuleError(
            None, text, 'is empty (it would match every device); write e.g. KERNEL=="null"'
        )
    filters: list[Filter] = []
    pos = 0
    index = 0
    while True:
        index += 1
        found = _TOKEN.match(text, pos)
        if found is None:
            raise RuleError(index, _rest_of_token(text, pos), _why_not_a_token(text, pos))
        filters.append(_filter(index, found))
        pos = found.end()
        if pos == len(text):
            return UdevRule(text, tuple(filters))
        if text[pos] != ",":
            raise RuleError(
                index,
                found.group(0).strip()[:_SHOWN],
                f"expected `,` after it, found {text[pos : pos + _SHOWN]!r}",
            )
        pos += 1


def _rest_of_token(text: str, pos: int) -> str:
    comma = text.find(",", pos)
    return text[pos : comma if comma != -1 else len(text)].strip()[:_SHOWN]


def _why_not_a_token(text: str, pos: int) -> str:
    fragment = text[pos:].lstrip()
    if not fragment or fragment.startswith(","):
        return 'is empty: expected FIELD=="value"'
    if '"' not in fragment:
        return 'expected FIELD=="value" or FIELD!="value" with the value in double quotes'
    if fragment.count('"') % 2:
        return "has an unterminated double-quoted value"
    return 'expected FIELD=="value" or FIELD!="value" (FIELD{key} for ATTR, ATTRS and ENV)'


def _filter(index: int, found: re.Match[str]) -> Filter:
    token = found.group(0).strip()[:_SHOWN]
    field, key, op = found.group("field"), found.group("key"), found.group("op")
    value = found.group("value").replace('\\"', '"')
    if field not in SUPPORTED_FIELDS:
        supported = ", ".join(sorted(SUPPORTED_FIELDS))
        if field in UDEV_ONLY_FIELDS:
            problem = f"{field} is a udev key that discovery does not support"
        else:
            problem = f"unknown field {field}"
        raise RuleError(index, token, f"{problem} (supported: {supported})")
    if op in ASSIGNMENTS:
        raise RuleError(
            index, token, f"assignment `{op}` is not supported: discovery only matches (== or !=)"
        )
    if field in KEYED_FIELDS and not key:
        raise RuleError(index, token, f"{field} needs a key: {field}{{name}}")
    if field in PLAIN_FIELDS and key is not None:
        raise RuleError(index, token, f"{field} takes no {{key}}")
    negate = op == "!="
    mode = mode_for(field, negate)
    key_pattern = None
    try:
        if mode == "regex":
            pattern = Regex(value, dot_matches_newline=True)
        else:
            pattern = Regex(glob_to_regex(value), dot_matches_newline=True)
            if field == "ENV":
                key_pattern = Regex(glob_to_regex(key or ""), dot_matches_newline=True)
    except GlobError as exc:
        raise RuleError(index, token, f"glob {exc.args[0]}") from exc
    except RegexError as exc:
        raise RuleError(
            index, token, f"{value[:_SHOWN]!r} is not a valid regular expression: {exc}"
        ) from exc
    return Filter(field, key, negate, value, mode, pattern, key_pattern)


# ---- matching ------------------------------------------------------------------------------------


def rule_matches(rule: UdevRule, device: DeviceSnapshot) -> bool:
    """Would upstream's handler select `device` (an enumerated device) for `rule`?"""
    globs = [f for f in rule.filters if f.mode == "glob"]
    return (
        _enumerator_match(globs, device)
        and not any(_nomatch_hit(f, device) for f in rule.filters if f.mode == "noglob")
        and all(_regex_keeps(f, device) for f in rule.filters if f.mode == "regex")
    )


def _any_of(filters: Sequence[Filter], value: str | None) -> bool:
    """The enumerator ORs the patterns of one kind; no patterns of that kind = no constraint."""
    if not filters:
        return True
    return value is not None and any(f.test(value) for f in filters)


def _enumerator_match(globs: Sequence[Filter], device: DeviceSnapshot) -> bool:
    def of(field: str) -> list[Filter]:
        return [f for f in globs if f.field == field]

    if not _any_of(of("SUBSYSTEM"), device.subsystem):
        return False
    if not _any_of(of("KERNEL"), device.sys_name):
        return False
    if not _any_of(of("DEVPATH"), device.devpath):
        return False
    # Tags: every one must be present.
    if not all(any(f.test(t) for t in device.tags) for f in of("TAG")):
        return False
    # Attributes: every key must match one of its patterns.
    by_key: dict[str, list[Filter]] = {}
    for f in of("ATTR"):
        by_key.setdefault(f.key or "", []).append(f)
    for key, filters in by_key.items():
        if not _any_of(filters, device.attributes.get(key)):
            return False
    # Properties: one matching pair among all of them is enough (the key is a glob too).
    env = of("ENV")
    return not env or any(
        f.key_pattern is not None and f.key_pattern.fullmatch(name) and f.test(value)
        for f in env
        for name, value in device.properties.items()
    )


def _nomatch_hit(f: Filter, device: DeviceSnapshot) -> bool:
    if f.field == "SUBSYSTEM":
        return device.subsystem is not None and f.test(device.subsystem)
    value = device.attributes.get(f.key or "")  # ATTR
    return value is not None and f.test(value)


def _regex_keeps(f: Filter, device: DeviceSnapshot) -> bool:
    """The post-filters, field by field as upstream's `filter_by_remaining_udev_filters`."""
    field = f.field
    if field in ("DEVPATH", "KERNEL", "TAG", "ENV"):
        # Only `!=` reaches here for these (`==` went to the enumerator).
        if field == "DEVPATH":
            return not f.test(device.devpath)
        if field == "KERNEL":
            return not f.test(device.sys_name)
        if field == "TAG":
            return not any(f.test(t) for t in device.tags)
        value = device.properties.get(f.key or "")
        return value is None or not f.test(value)
    if field == "DRIVER":
        if device.driver is None:
            return f.negate
        return f.test(device.driver) != f.negate
    return _lineage_has(f, device) != f.negate


def _lineage_has(f: Filter, device: DeviceSnapshot) -> bool:
    for d in device.lineage():
        if f.field == "KERNELS":
            values: Sequence[str | None] = [d.sys_name]
        elif f.field == "SUBSYSTEMS":
            values = [d.subsystem]
        elif f.field == "DRIVERS":
            values = [d.driver]
        elif f.field == "ATTRS":
            values = [d.attributes.get(f.key or "")]
        else:  # TAGS
            values = sorted(d.tags)
        if any(v is not None and f.test(v) for v in values):
            return True
    return False


def attribute_keys(rules: Sequence[UdevRule]) -> frozenset[str]:
    """The sysfs attributes the rules look at (the I/O edge reads only these)."""
    return frozenset(
        f.key for r in rules for f in r.filters if f.field in ("ATTR", "ATTRS") and f.key
    )
