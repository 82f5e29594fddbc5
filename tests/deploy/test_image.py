"""The image's inputs, without building it: what goes into the build context and its hash, the
podman command, the pins in constraints.txt, and the Dockerfile's promises (multi-stage, BASE,
the CA bundle only as a build secret, an unprivileged default user). Then the image the deploy
tests run (built and imported into the node as they do it), read file by file: what must not be
in it (the development package, compilers and headers, build and test tools, caches, modules
without bytecode, extension modules with their symbol tables). Its size is a measurement, in
bench/image_size.py and bench/RESULTS.md, not asserted here."""

from __future__ import annotations

import re
import struct
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from akri_trio_dev.cluster.image import (
    BASE_IMAGE,
    IMAGE_REPOSITORY,
    build_command,
    content_hash,
    context_files,
    ensure_image,
    image_ref,
)
from akri_trio_dev.cluster.image_contents import VENV, Contents, has_symbol_table, image_contents

REPO = Path(__file__).resolve().parents[2]


def test_context_leaves_out_the_development_tools_and_caches() -> None:
    files = context_files(REPO)
    assert {"Dockerfile", "constraints.txt", "pyproject.toml", "akri_trio/cli.py"} <= set(files)
    assert "akri_trio/agent/run.py" in files
    assert not [f for f in files if f.startswith("akri_trio_dev/")]
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    assert not [f for f in files if f.startswith(("tests/", "bench/", ".venv/"))]


def test_dockerignore_lets_in_only_what_the_dockerfile_copies() -> None:
    lines = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines[0] == "*"  # everything out, then only what the Dockerfile copies back in
    copied = {
        source
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for source in line.split()[1:-1]
    }
    assert {line[1:] for line in lines if line.startswith("!")} == copied
    assert "akri_trio_dev" not in copied


def test_content_hash_changes_with_any_byte_path_or_base() -> None:
    files = [("a.py", b"x = 1\n"), ("b.py", b"")]
    h = content_hash(files, "base:1")
    assert h == content_hash(list(reversed(files)), "base:1")  # order does not matter
    assert h != content_hash([("a.py", b"x = 2\n"), ("b.py", b"")], "base:1")
    assert h != content_hash([("c.py", b"x = 1\n"), ("b.py", b"")], "base:1")
    assert h != content_hash(files, "base:2")
    # path and contents are delimited: moving bytes between them changes the hash
    assert content_hash([("ab", b"c")], "b") != content_hash([("a", b"bc")], "b")
    assert len(h) == 16


def test_image_ref_is_stable_for_the_same_tree() -> None:
    ref = image_ref(REPO)
    assert ref == image_ref(REPO)
    assert ref.startswith(f"{IMAGE_REPOSITORY}:")


def test_build_command_passes_the_ca_as_a_secret_and_the_base_as_an_arg() -> None:
    cmd = build_command(
        repo=REPO, ref="r:1", base=BASE_IMAGE, ca_bundle=Path("/ca.pem"), tags=["r:latest"]
    )
    assert cmd[:2] == ["podman", "build"]
    at = cmd.index("--secret")
    assert cmd[at + 1] == "id=cacert,src=/ca.pem"
    assert f"BASE={BASE_IMAGE}" in cmd
    assert cmd[-1] == str(REPO)
    assert {"r:1", "r:latest"} <= set(cmd)
    no_ca = build_command(repo=REPO, ref="r:1", base=BASE_IMAGE, ca_bundle=None)
    assert "--secret" not in no_ca


def test_constraints_pin_every_runtime_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"not an exact pin: {line}"
            pins[canonicalize_name(name)] = version
    for spec in project["dependencies"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt (just lock)"
        assert req.specifier.contains(pins[name], prereleases=True), (spec, pins[name])
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    for spec in build:  # the builder stage installs the project without build isolation
        req = Requirement(spec)
        assert req.specifier.contains(pins[canonicalize_name(req.name)])


def test_dockerfile_promises() -> None:
    text = (REPO / "Dockerfile").read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    froms = [line for line in instructions if line.startswith("FROM ")]
    assert froms == ["FROM ${BASE} AS builder", "FROM ${BASE} AS runtime", "FROM scratch"]
    # the image is the trimmed runtime stage in one layer, bytecode included
    assert "COPY --from=runtime / /" in instructions
    assert "PYTHONDONTWRITEBYTECODE=1" in text
    # no compiler, headers or test suites ship
    assert "lxml/includes" in text and "$py/test" in text
    assert instructions[0].startswith("ARG BASE=")
    # the CA bundle reaches pip only through the secret mount, never a COPY or an ENV
    assert "--mount=type=secret,id=cacert" in text
    assert not [
        line
        for line in instructions
        if "cacert" in line and line.startswith(("COPY", "ENV", "ADD"))
    ]
    user = [line for line in instructions if line.startswith("USER ")]
    assert user == ["USER 65532:65532"]
    assert 'ENTRYPOINT ["akri-trio"]' in instructions
    assert "libudev1" in text


def elf64(*section_types: int) -> bytes:
    """A little-endian ELF64 file of section headers only: what has_symbol_table reads."""
    header = bytearray(0x40)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, 0x40)  # e_shoff: right after this header
    struct.pack_into("<HH", header, 0x3A, 0x40, len(section_types))  # e_shentsize, e_shnum
    sections = b"".join(struct.pack("<II", 0, kind) + bytes(0x38) for kind in section_types)
    return bytes(header) + sections


def test_a_symbol_table_section_is_found_and_dynamic_symbols_are_not_one() -> None:
    null, progbits, symtab, strtab, dynsym = 0, 1, 2, 3, 11
    assert has_symbol_table(elf64(null, progbits, symtab, strtab, dynsym))
    assert not has_symbol_table(elf64(null, progbits, strtab, dynsym))  # what strip leaves
    assert not has_symbol_table(b"#!/bin/sh\n" + bytes(100))  # not ELF
    assert not has_symbol_table(elf64(symtab)[:0x40])  # headers past the end are not read


# -- the built image ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def contents(node_cluster: dict[str, str]) -> Contents:
    """Every file of the image the deploy tests run, as the node has it."""
    return image_contents(ensure_image())


def distributions(contents: Contents) -> set[str]:
    """The canonical names of the Python distributions installed anywhere in the image."""
    found = re.compile(r"(?:^|/)(?:site|dist)-packages/([^/]+?)-[^/-]+\.dist-info/METADATA$")
    return {canonicalize_name(m[1]) for path in contents.files if (m := found.search(path))}


def test_image_holds_no_development_package_or_tool(contents: Contents) -> None:
    assert not [path for path in contents.files if "akri_trio_dev" in path]
    installed = distributions(contents)
    assert "akri-trio" in installed and "cryptography" in installed  # the reading works
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    dev = {canonicalize_name(Requirement(spec).name) for spec in optional["dev"]}
    assert dev, "pyproject.toml lists the development extras"
    assert not installed & (dev | {"pip", "setuptools", "wheel", "pytest"})
    # no pip, build or bytecode cache was left in a layer
    assert not [path for path in contents.files if "/.cache/" in f"/{path}"]
    assert not [path for path in contents.files if path.startswith(("tmp/", "src/"))]
    # test suites of the installed packages were removed where they were shipped
    site = f"{VENV}lib/python3.11/site-packages/"
    assert not [p for p in contents.files if p.startswith(site) and "/tests/" in p]


def test_image_holds_no_compiler_headers_or_build_tools(contents: Contents) -> None:
    tools = {"gcc", "cc", "c++", "g++", "cpp", "clang", "ld", "as", "strip", "make", "cmake"}
    bins = {
        path.rsplit("/", 1)[-1]
        for path in contents.files
        if re.match(r"(usr/)?(local/)?s?bin/", path) or path.startswith(f"{VENV}bin/")
    }
    assert "python3.11" in bins and "akri-trio" in bins  # the listing reaches the binaries
    assert not bins & tools
    assert not [b for b in bins if re.fullmatch(r".*-(gcc|g\+\+|ld|as)(-\d+)?", b)]
    assert not [p for p in contents.files if p.startswith(("usr/include/", "usr/lib/gcc/"))]
    assert not [p for p in contents.files if p.endswith(("/Python.h", ".a"))]


def test_every_python_module_in_the_image_has_its_bytecode(contents: Contents) -> None:
    """The venv (the product and its packages) and the standard library: a process never
    compiles at start-up (PYTHONDONTWRITEBYTECODE=1 would make it compile on every start)."""
    lib = re.compile(r"(?:^|/)lib/python3\.(\d+)/")
    checked = 0
    missing = []
    for path in contents.files:
        if not path.endswith(".py") or not (m := lib.search(path)):
            continue
        folder, _, name = path.rpartition("/")
        pyc = f"{folder}/__pycache__/{name[:-3]}.cpython-3{m[1]}.pyc"
        checked += 1
        if pyc not in contents.files:
            missing.append(path)
    assert checked > 1000  # the venv and the standard library were both seen
    assert f"{VENV}lib/python3.11/site-packages/akri_trio/__pycache__/cli.cpython-311.pyc" in (
        contents.files
    )
    assert missing == []


def test_extension_modules_in_the_venv_are_stripped(contents: Contents) -> None:
    modules = [p for p in contents.files if p.startswith(VENV) and p.endswith(".so")]
    assert len(modules) > 10  # cryptography, lxml, re2, PyYAML, zeroconf, protobuf, ...
    assert contents.unstripped == []
