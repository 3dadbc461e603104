"""Hypothesis strategies for the fuzz tests: odd values (wrong types, out-of-range numbers, odd unicode, URLs and
interpolations), mutations of a parsed YAML tree, and corruptions of raw text."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

# Strings that have broken parsers before: empty, numbers as text, units, interpolations (one of them circular),
# URLs of every store, paths that escape, control and bidi characters, a lone combining mark, a long run.
ODD_STRINGS = [
    "", " ", "-1", "0", "1e309", "nan", "inf", "-inf", "true", "null", "~", "0x10", "1_000", "3.5ba", "-2ep", "0ba",
    "1tok", "10sp", "ba", "1e2dur", "${variables.missing}", "${variables}", "${", "${variables.a.b}", "$${x}",
    "s3://", "s3:///key", "s3://bucket/../../etc", "gs://bucket/x", "hf://", "dbfs:/x", "oci://b/o", "file:///x",
    "../../../../etc/passwd", "/dev/null", "/", ".", "\x00", "\u202e\u202d", "\ufeff", "\u0301", "\U0001f600" * 3,
    "a" * 5000, "é" * 300, "\\", "'", '"', "key: value", "- item", "[1, 2", "{a: 1", "%TAG", "&anchor", "*alias",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ODD_STRINGS),
    st.text(max_size=40),
)

values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.text(max_size=12), st.sampled_from(ODD_STRINGS[:20])),
                                            inner, max_size=4)),
    max_leaves=8,
)

keys = st.one_of(st.sampled_from(["name", "type", "kwargs", "d_model", "n_layers", "max_seq_len", "dataset", "lr",
                                  "variables", "code_paths", "max_duration", "loggers", "callbacks", "fsdp_config",
                                  "icl_tasks", "models", "load_path", "save_folder", "x" * 200, "", "é", "0"]),
                 st.text(min_size=1, max_size=16))


def node_paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (a tuple of dict keys and list indices) to a node of ``tree``, the root excluded."""
    found = []
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list):
        items = enumerate(tree)
    else:
        return found
    for key, child in items:
        found.append(prefix + (key,))
        found += node_paths(child, prefix + (key,))
    return found


def _parent(tree: Any, path: tuple) -> Any:
    for part in path[:-1]:
        tree = tree[part]
    return tree


@st.composite
def mutated_tree(draw, tree: dict) -> tuple[dict, list[str]]:
    """``tree`` after one to three mutations (delete, replace, add an unknown key, rename, wrap, empty), and the
    list of what was done (for the failure message)."""
    tree = copy.deepcopy(tree)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        paths = node_paths(tree)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = _parent(tree, path)
        op = draw(st.sampled_from(["delete", "replace", "replace", "add", "rename", "wrap", "empty"]))
        if op == "delete":
            del parent[path[-1]]
        elif op == "replace":
            parent[path[-1]] = draw(values)
        elif op == "add":
            target = parent[path[-1]] if isinstance(parent[path[-1]], dict) else parent
            if isinstance(target, dict):
                target[draw(keys)] = draw(values)
            else:
                target.append(draw(values))
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(keys)] = parent.pop(path[-1])
        elif op == "wrap":
            parent[path[-1]] = [parent[path[-1]]] if draw(st.booleans()) else {draw(keys): parent[path[-1]]}
        elif op == "empty":
            parent[path[-1]] = draw(st.sampled_from([{}, [], "", None]))
        done.append(f"{op} {'.'.join(map(str, path))}")
    return tree, done


@st.composite
def corrupted_text(draw, text: str) -> str:
    """``text`` with a few characters inserted, deleted or replaced: YAML syntax errors, odd indentation, odd
    unicode."""
    pieces = st.one_of(st.sampled_from([":", "{", "}", "[", "]", "- ", "&", "*", "!", "|", ">", "'", '"', "%", "@",
                                        "`", "#", "\t", "\n", "  ", "${", "!!python/object:os.system", "\x00",
                                        "\u2028", "\ufeff", "\x85", "? "]),
                       st.text(min_size=1, max_size=4))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            text = text[:at] + draw(pieces) + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 20)):]
        else:
            text = text[:at] + draw(pieces) + text[at + 1:]
    return text


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
identifiers = st.builds(str.__add__, st.sampled_from(_LETTERS), st.text(alphabet=_LETTERS + "0123456789", max_size=10))


def override_key(path: tuple) -> str:
    return ".".join(str(p) for p in path)


@st.composite
def overrides(draw, tree: dict) -> list[str]:
    """``key=value`` command-line overrides: keys of the recipe or made up, values of any shape (as YAML text)."""
    result = []
    paths = node_paths(tree)
    for _ in range(draw(st.integers(1, 3))):
        if paths and draw(st.booleans()):
            key = override_key(draw(st.sampled_from(paths)))
        else:
            key = ".".join(draw(st.lists(identifiers, min_size=1, max_size=3)))
        value = draw(st.one_of(st.sampled_from(ODD_STRINGS), st.text(max_size=20),
                               st.integers().map(str), st.sampled_from(["[1,2]", "{a: 1}", "[", "{", "null"])))
        result.append(f"{key}={value}")
    return result
