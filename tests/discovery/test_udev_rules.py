"""The udev rule subset, pure: parsing (and every way a rule is refused), glob semantics checked
against the C library's own fnmatch(3), and matching over hand-made device trees."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from akri_trio.discovery.handlers.udev_rules import (
    DeviceSnapshot,
    GlobError,
    RuleError,
    UdevRule,
    attribute_keys,
    glob_to_regex,
    parse_rule,
    rule_matches,
)
from akri_trio.discovery.linear_regex import Regex

# ---- parsing ------------------------------------------------------------------------------------


def test_parses_upstreams_example() -> None:
    rule = parse_rule('KERNEL=="video[0-9]*",SUBSYSTEM=="video4linux", ATTR{idVendor}=="05a9"')
    assert [(f.field, f.key, f.negate, f.value, f.mode) for f in rule.filters] == [
        ("KERNEL", None, False, "video[0-9]*", "glob"),
        ("SUBSYSTEM", None, False, "video4linux", "glob"),
        ("ATTR", "idVendor", False, "05a9", "glob"),
    ]


@pytest.mark.parametrize(
    ("token", "mode"),
    [
        ('DEVPATH=="x"', "glob"),
        ('KERNEL=="x"', "glob"),
        ('TAG=="x"', "glob"),
        ('SUBSYSTEM=="x"', "glob"),
        ('ATTR{k}=="x"', "glob"),
        ('ENV{k}=="x"', "glob"),
        ('ATTR{k}!="x"', "noglob"),
        ('SUBSYSTEM!="x"', "noglob"),
        ('DEVPATH!="x"', "regex"),
        ('KERNEL!="x"', "regex"),
        ('TAG!="x"', "regex"),
        ('ENV{k}!="x"', "regex"),
        ('DRIVER=="x"', "regex"),
        ('DRIVER!="x"', "regex"),
        ('KERNELS=="x"', "regex"),
        ('SUBSYSTEMS!="x"', "regex"),
        ('DRIVERS=="x"', "regex"),
        ('ATTRS{k}=="x"', "regex"),
        ('TAGS!="x"', "regex"),
    ],
)
def test_each_field_and_op_is_matched_the_way_upstream_does(token: str, mode: str) -> None:
    assert parse_rule(token).filters[0].mode == mode


def test_whitespace_commas_in_values_and_escaped_quotes() -> None:
    rule = parse_rule('  ATTR{name} == "a, b" ,ENV{X}!="say \\"hi\\""  ')
    assert [(f.key, f.value) for f in rule.filters] == [("name", "a, b"), ("X", 'say "hi"')]
    # Backslashes other than \" stay: they belong to the regex or glob.
    assert parse_rule(r'KERNEL!="video\d+"').filters[0].value == r"video\d+"


def refusal(text: str) -> RuleError:
    with pytest.raises(RuleError) as info:
        parse_rule(text)
    return info.value


def test_refuses_assignments_naming_the_token() -> None:
    for op in ("=", "+=", "-=", ":="):
        err = refusal(f'KERNEL=="video0", SYMLINK{op}"cam"')
        assert err.token == 2 and err.text == f'SYMLINK{op}"cam"'
        # SYMLINK is refused as a field first; an assignment to a supported field too:
        err = refusal(f'KERNEL=="video0", KERNEL{op}"x"')
        assert (err.token, err.text) == (2, f'KERNEL{op}"x"')
        assert f"assignment `{op}` is not supported" in err.problem


def test_refuses_udev_only_and_unknown_fields() -> None:
    err = refusal('KERNEL=="a", RUN+="/bin/sh"')
    assert err.token == 2
    assert "RUN is a udev key that discovery does not support" in str(err)
    assert "supported: ATTR, ATTRS, DEVPATH" in str(err)
    for field in ("NAME", "GOTO", "ACTION", "PROGRAM", "TEST", "IMPORT{program}"):
        assert "does not support" in refusal(f'{field}=="x"').problem
    err = refusal('KERNEL=="a", TYPO=="blah"')
    assert (err.token, err.text) == (2, 'TYPO=="blah"')
    assert err.problem.startswith("unknown field TYPO")
    assert refusal('kernel=="null"').problem.startswith("unknown field kernel")  # case matters


def test_refuses_missing_or_extra_keys() -> None:
    assert refusal('ATTR=="x"').problem == "ATTR needs a key: ATTR{name}"
    assert refusal('ENV{}=="x"').problem == "ENV needs a key: ENV{name}"
    assert refusal('KERNEL{x}=="x"').problem == "KERNEL takes no {key}"


def test_refuses_malformed_tokens() -> None:
    assert refusal("").token is None
    assert "would match every device" in str(refusal("   "))
    err = refusal('KERNEL=="a",')
    assert (err.token, err.problem) == (2, 'is empty: expected FIELD=="value"')
    assert refusal('KERNEL=="a",,KERNEL=="b"').token == 2
    assert "double quotes" in refusal("KERNEL==null").problem
    assert "unterminated" in refusal('KERNEL=="null').problem
    err = refusal('KERNEL=="a" SUBSYSTEM=="mem"')
    assert err.token == 1 and "expected `,` after it" in err.problem
    assert refusal('KERNEL<>"a"').token == 1


def test_refuses_bad_regexes_at_parse_time() -> None:
    err = refusal('KERNEL=="ok", DRIVERS=="usb(["')
    assert err.token == 2
    assert "'usb([' is not a valid regular expression" in err.problem
    # The same text is a fine glob where the enumerator matches:
    assert parse_rule('KERNEL=="usb("').filters[0].mode == "glob"
    assert "not a valid regular expression" in refusal('DRIVERS=="usb("').problem


def test_refuses_malformed_globs_at_parse_time() -> None:
    err = refusal('SUBSYSTEM=="tty", KERNEL=="tty[0-9*"')
    assert (err.token, err.problem) == (2, "glob has an unclosed [")
    # A lone trailing backslash cannot get through the quoting (`\"` escapes the quote)...
    with pytest.raises(GlobError, match="lone backslash"):
        glob_to_regex("x\\")
    # ...and a doubled one is a quoted backslash.
    quoted = parse_rule(r'ATTR{a}=="x\\"')
    assert rule_matches(quoted, DeviceSnapshot("/d", "d", attributes={"a": "x\\"}))
    assert refusal('ENV{ID_[}=="x"').problem == "glob has an unclosed ["  # the key is a glob
    assert parse_rule('ENV{ID_[}!="x"').filters[0].key == "ID_["  # a regex filter: exact key


def test_error_messages_name_token_and_text() -> None:
    assert str(refusal('KERNEL=="a", NAME="b"')).startswith('token 2 `NAME="b"`: NAME is a udev')


def test_attribute_keys() -> None:
    rules = [parse_rule('ATTR{a}=="1", ATTRS{b}!="2", ENV{c}=="3"'), parse_rule('ATTR{d}!="4"')]
    assert attribute_keys(rules) == {"a", "b", "d"}


# ---- globs, against the C library ---------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c"))


def libc_fnmatch(pattern: str, text: str) -> bool:
    return bool(_libc.fnmatch(pattern.encode(), text.encode(), 0) == 0)


def glob_matches(pattern: str, text: str) -> bool:
    return Regex(glob_to_regex(pattern), dot_matches_newline=True).fullmatch(text)


GLOB_ALPHABET = "ab0/-*?[]!^\\."


@settings(max_examples=3000)
@given(st.text(GLOB_ALPHABET, max_size=8), st.text("ab0/-[]!^\\.*?", max_size=5))
def test_globs_agree_with_libc_fnmatch(pattern: str, text: str) -> None:
    # Collating symbols and equivalence classes ([.a.], [=a=]) are not supported.
    assume("[." not in pattern and "[=" not in pattern)
    try:
        glob_to_regex(pattern)
    except GlobError:
        assume(False)  # refused at parse time, see test_refuses_malformed_globs_at_parse_time
    assert glob_matches(pattern, text) == libc_fnmatch(pattern, text), glob_to_regex(pattern)


@settings(max_examples=1000)
@given(st.text("a5Z:-]!", max_size=4), st.sampled_from(["digit", "alpha", "upper", "xdigit"]))
def test_posix_classes_agree_with_libc(text: str, name: str) -> None:
    pattern = f"[[:{name}:]]*"
    assert glob_matches(pattern, text) == libc_fnmatch(pattern, text)


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("tty[0-9]*", "tty12", True),
        ("tty[0-9]*", "ttyS0", False),
        ("video?", "video0", True),
        ("*", "/devices/a/b", True),  # `*` crosses `/` (no FNM_PATHNAME)
        ("[!a]", "b", True),
        ("[^a]", "a", False),
        ("\\*", "*", True),
        ("\\*", "x", False),
        ("[]]", "]", True),
        ("[!]]", "]", False),
        ("[a-]", "-", True),
        ("[z-a]", "b", False),
    ],
)
def test_glob_examples(pattern: str, text: str, expected: bool) -> None:
    assert glob_matches(pattern, text) is expected
    assert libc_fnmatch(pattern, text) is expected


# ---- matching -----------------------------------------------------------------------------------

PCI = DeviceSnapshot(
    "/devices/pci0000:00/0000:00:14.0",
    "0000:00:14.0",
    subsystem="pci",
    driver="xhci_hcd",
    attributes={"vendor": "0x8086"},
)
USB = DeviceSnapshot(
    "/devices/pci0000:00/0000:00:14.0/usb1/1-1",
    "1-1",
    subsystem="usb",
    driver="usb",
    devnode="/dev/bus/usb/001/002",
    attributes={"idVendor": "05a9", "idProduct": "4519"},
    properties={"ID_VENDOR_ID": "05a9"},
    tags=frozenset({"seat", "uaccess"}),
    parent=PCI,
)
IFACE = DeviceSnapshot(
    "/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0",
    "1-1:1.0",
    subsystem="usb",
    driver="uvcvideo",
    parent=USB,
)
VIDEO = DeviceSnapshot(
    "/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0/video4linux/video0",
    "video0",
    subsystem="video4linux",
    devnode="/dev/video0",
    attributes={"name": "USB Camera", "index": "0"},
    properties={"ID_V4L_CAPABILITIES": ":capture:", "DEVNAME": "/dev/video0", "MAJOR": "81"},
    tags=frozenset({"uaccess"}),
    parent=IFACE,
)
NULL = DeviceSnapshot(
    "/devices/virtual/mem/null",
    "null",
    subsystem="mem",
    devnode="/dev/null",
    attributes={"dev": "1:3"},
    properties={"DEVMODE": "0666"},
)
ALL = [PCI, USB, IFACE, VIDEO, NULL]


def selected(text: str) -> list[str]:
    rule = parse_rule(text)
    return [d.sys_name for d in ALL if rule_matches(rule, d)]


@pytest.mark.parametrize(
    ("rule", "names"),
    [
        ('KERNEL=="video[0-9]*"', ["video0"]),
        ('KERNEL=="null"', ["null"]),
        ('KERNEL!="null", KERNEL!="video0", KERNEL!="1-1:.*"', ["0000:00:14.0", "1-1"]),
        ('SUBSYSTEM=="usb"', ["1-1", "1-1:1.0"]),
        ('SUBSYSTEM!="usb"', ["0000:00:14.0", "video0", "null"]),
        ('SUBSYSTEM!="u*", SUBSYSTEM!="pci"', ["video0", "null"]),
        ('DEVPATH=="/devices/virtual/*"', ["null"]),
        ('DEVPATH!="/devices/pci.*"', ["null"]),
        ('DRIVER=="uvc.*"', ["1-1:1.0"]),
        ('DRIVER!="usb"', ["0000:00:14.0", "1-1:1.0", "video0", "null"]),  # no driver passes
        ('ATTR{idVendor}=="05a9"', ["1-1"]),
        ('ATTR{idVendor}!="05a9"', ["0000:00:14.0", "1-1:1.0", "video0", "null"]),
        ('ATTR{name}=="USB *"', ["video0"]),
        ('ATTRS{idVendor}=="05a9"', ["1-1", "1-1:1.0", "video0"]),
        ('ATTRS{idVendor}!="05a9"', ["0000:00:14.0", "null"]),
        ('SUBSYSTEMS=="pci"', ["0000:00:14.0", "1-1", "1-1:1.0", "video0"]),
        ('SUBSYSTEMS!="usb"', ["0000:00:14.0", "null"]),
        ('DRIVERS=="uvcvideo"', ["1-1:1.0", "video0"]),
        ('KERNELS=="1-1"', ["1-1", "1-1:1.0", "video0"]),
        ('KERNELS=="1-"', []),  # a regex must span the whole value
        ('ENV{ID_VENDOR_ID}=="05a9"', ["1-1"]),
        ('ENV{ID_V4L_*}=="*capture*"', ["video0"]),  # the enumerator globs the key too
        ('ENV{DEVMODE}!="0666"', ["0000:00:14.0", "1-1", "1-1:1.0", "video0"]),
        ('TAG=="uaccess"', ["1-1", "video0"]),
        ('TAG=="seat", TAG=="uaccess"', ["1-1"]),  # tags: all of them
        ('TAG!="seat"', ["0000:00:14.0", "1-1:1.0", "video0", "null"]),
        ('TAGS=="seat"', ["1-1", "1-1:1.0", "video0"]),
        ('SUBSYSTEM=="video4linux", ATTRS{idVendor}=="05a9", DRIVERS=="uvcvideo"', ["video0"]),
    ],
)
def test_matching(rule: str, names: list[str]) -> None:
    assert selected(rule) == names


def test_enumerator_ors_values_of_one_kind() -> None:
    # Upstream hands both to libudev's match_sysname, which accepts either: kept as is.
    assert selected('KERNEL=="null", KERNEL=="video0"') == ["video0", "null"]
    assert selected('SUBSYSTEM=="mem", SUBSYSTEM=="pci"') == ["0000:00:14.0", "null"]
    assert selected('ENV{DEVMODE}=="0666", ENV{MAJOR}=="81"') == ["video0", "null"]
    # ...but different attribute keys must all match, and different kinds are ANDed.
    assert selected('ATTR{idVendor}=="05a9", ATTR{idProduct}=="0000"') == []
    assert selected('KERNEL=="null", SUBSYSTEM=="pci"') == []


def test_regex_must_span_the_value_leftmost_first_as_rust() -> None:
    dev = DeviceSnapshot("/devices/x", "x", driver="ab")
    assert not rule_matches(parse_rule('DRIVER=="a|ab"'), dev)  # Rust `find` stops at "a"
    assert rule_matches(parse_rule('DRIVER=="ab|a"'), dev)
    assert not rule_matches(parse_rule('DRIVER=="b"'), dev)


def test_missing_values_never_match_but_pass_negations() -> None:
    bare = DeviceSnapshot("/devices/bare", "bare")  # no subsystem, driver, attributes, tags
    for rule, expected in [
        ('SUBSYSTEM=="*"', False),
        ('SUBSYSTEM!="*"', True),
        ('ATTR{a}=="*"', False),
        ('ATTR{a}!="*"', True),
        ('DRIVER==".*"', False),
        ('DRIVER!=".*"', True),
        ('ENV{a}=="*"', False),
        ('ENV{a}!=".*"', True),
        ('TAG=="*"', False),
        ('TAG!=".*"', True),
        ('TAGS==".*"', False),
    ]:
        assert rule_matches(parse_rule(rule), bare) is expected, rule


values = st.text("ab.*?", max_size=3)


def parsed(text: str) -> UdevRule:
    """The rule, or a skipped example if `text` is no valid regex (e.g. `*`)."""
    try:
        return parse_rule(text)
    except RuleError:
        assume(False)
        raise


names = st.text("ab", min_size=1, max_size=3)


@st.composite
def chains(draw: st.DrawFn) -> DeviceSnapshot:
    """A device with a few ancestors; every field optional."""
    device: DeviceSnapshot | None = None
    for depth in range(draw(st.integers(1, 4))):
        device = DeviceSnapshot(
            devpath=(device.devpath if device else "") + f"/d{depth}",
            sys_name=draw(names),
            subsystem=draw(st.none() | names),
            driver=draw(st.none() | names),
            attributes=draw(st.dictionaries(st.sampled_from("kl"), names, max_size=2)),
            properties=draw(st.dictionaries(st.sampled_from("kl"), names, max_size=2)),
            tags=frozenset(draw(st.lists(names, max_size=2))),
            parent=device,
        )
    assert device is not None
    return device


FIELDS = ["KERNEL", "SUBSYSTEM", "DRIVER", "DEVPATH", "KERNELS", "SUBSYSTEMS", "DRIVERS", "TAGS"]
FIELDS += ["ATTR{k}", "ATTRS{k}", "ENV{k}", "TAG"]


@given(chains(), st.sampled_from(FIELDS), values)
def test_negation_is_the_complement_where_upstream_makes_it_one(
    device: DeviceSnapshot, field: str, value: str
) -> None:
    """For the regex-only fields (same matcher both ways) `!=` selects exactly what `==` does
    not. Where `==` is a glob and `!=` a regex, no such law holds, which is upstream's."""
    equal, unequal = parsed(f'{field}=="{value}"'), parsed(f'{field}!="{value}"')
    if equal.filters[0].mode == unequal.filters[0].mode:
        assert rule_matches(equal, device) != rule_matches(unequal, device)


@settings(deadline=None)  # regex compilation under a loaded machine, not a performance claim
@given(
    chains(),
    st.lists(
        st.tuples(st.sampled_from(FIELDS), st.sampled_from(["==", "!="]), values),
        min_size=2,
        max_size=4,
    ),
)
def test_different_fields_are_anded(
    device: DeviceSnapshot, tokens: list[tuple[str, str, str]]
) -> None:
    # Only across distinct (field, op) pairs: same-kind enumerator matches are ORed.
    if len({(f, op) for f, op, _ in tokens}) < len(tokens):
        return
    rules = [parsed(f'{f}{op}"{v}"') for f, op, v in tokens]
    combined = UdevRule("", tuple(r.filters[0] for r in rules))
    assert rule_matches(combined, device) == all(rule_matches(r, device) for r in rules)


# ---- hostile rules and device data: linear time, bounded size ------------------------------------


# The bound below is far above what a linear run takes even on a loaded 2-core machine (a few
# ms) and far below the backtracking or quadratic behaviour these tests guard against (seconds
# to minutes), so the tests say "not super-linear" without timing anything finely.
LINEAR_BOUND_S = 3.0


def elapsed(action: object) -> float:
    assert callable(action)
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


@pytest.mark.parametrize("regex", ["(a+)+b", "(a|aa)*b", "(a*)*b", "(.*a){20}b"])
def test_catastrophic_regexes_return_at_once(regex: str) -> None:
    # Python's backtracking `re` needs minutes for these on 30 characters; RE2 is linear.
    rule = parse_rule(f'KERNELS=="{regex}"')
    for length in (30, 100_000):
        device = DeviceSnapshot("/devices/x", "a" * length)
        assert elapsed(lambda: rule_matches(rule, device)) < LINEAR_BOUND_S  # noqa: B023
        assert not rule_matches(rule, device)
    assert rule_matches(rule, DeviceSnapshot("/devices/x", "a" * 30 + "b"))


def test_globs_full_of_stars_match_in_linear_time() -> None:
    rule = parse_rule('KERNEL=="' + "*a" * 1000 + 'b"', max_length=10_000)
    device = DeviceSnapshot("/devices/x", "a" * 50_000)
    assert elapsed(lambda: rule_matches(rule, device)) < LINEAR_BOUND_S
    assert not rule_matches(rule, device)


@pytest.mark.parametrize("piece", ["[[:", "[[:alpha", "[!", "[a-", "\\a", "*?"])
def test_the_glob_translator_is_linear(piece: str) -> None:
    pattern = piece * (160_000 // len(piece))  # a 160 KB glob took 11 s with `[[:`

    def translate() -> None:
        with contextlib.suppress(GlobError):
            glob_to_regex(pattern)

    assert elapsed(translate) < LINEAR_BOUND_S


def test_rules_longer_than_the_limit_are_refused() -> None:
    value = "a" * 5000
    with pytest.raises(RuleError, match="is 5010 characters long; the limit is 4096"):
        parse_rule(f'KERNEL=="{value}"')
    assert parse_rule(f'KERNEL=="{value}"', max_length=6000).filters[0].value == value
    with pytest.raises(RuleError) as info:
        parse_rule(f'KERNEL=="{value}" junk', max_length=6000)
    assert len(str(info.value)) < 300  # errors quote a bounded excerpt


@pytest.mark.parametrize("regex", ["(a)\\1", "(?=a)", "(?<!a)b"])
def test_what_re2_cannot_do_in_linear_time_is_refused_at_parse_time(regex: str) -> None:
    with pytest.raises(RuleError, match="not a valid regular expression"):
        parse_rule(f'DRIVERS=="{regex}"')
