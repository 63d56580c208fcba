"""A YAML reader that means what the file says, and costs what the file weighs.

PyYAML's ``safe_load`` is YAML 1.1 with its surprises, each refused here with
a one-line error naming the line and the value:

- a repeated key silently overwrites the first (``width: 2`` then ``width: 20``
  gives 20; a second ``pools:`` replaces the whole first list), on separate
  lines or on one (``{name: a, width: 2, width: 20}``);
- YAML 1.1 number forms read as numbers nobody wrote: ``010`` is 8 (octal),
  ``1:30`` is 90 (base 60), ``0x10``, ``0b10`` and ``1_000`` are numbers too.
  Only plain decimals are numbers here; quote anything else;
- aliases expand: a 926-byte file of nested aliases is billions of values once
  something walks it. The text, the alias count and the expanded size are capped,
  and an alias inside the value it names (``a: &a [*a]``) is refused.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
MAX_ALIASES = 200
# Values once every alias is expanded; a large fleet file is a few thousand.
MAX_EXPANDED_NODES = 500_000

_DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_DECIMAL_FLOAT = re.compile(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+")
_SPECIAL_FLOAT = re.compile(r"[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")


class DocumentTooLarge(yaml.YAMLError):
    """The document is over one of the caps above."""


class _StrictLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise DocumentTooLarge(
                    f"more than {MAX_ALIASES} aliases (line {mark.line + 1}); write the values out instead"
                )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue  # an unhashable key: construct_mapping below refuses it
            if first is not key_node:
                mark = first.start_mark
                raise ConstructorError(
                    None,
                    None,
                    f"duplicate key {_short(key)} (first on line {mark.line + 1}, column {mark.column + 1}); "
                    "each key may appear once",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        text = node.value
        if not _DECIMAL_INT.fullmatch(text):
            raise ConstructorError(
                None,
                None,
                f"{_short(text)} is a YAML 1.1 number form (octal, base 60, hex, binary or with '_'); "
                "write a plain decimal, or quote it for a string",
                node.start_mark,
            )
        return int(text)

    def construct_yaml_float(self, node: ScalarNode) -> float:
        text = node.value
        if not (_DECIMAL_FLOAT.fullmatch(text) or _SPECIAL_FLOAT.fullmatch(text)):
            raise ConstructorError(
                None,
                None,
                f"{_short(text)} is a YAML 1.1 number form (base 60 or with '_'); "
                "write a plain decimal, or quote it for a string",
                node.start_mark,
            )
        return super().construct_yaml_float(node)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def load(text: str) -> Any:
    """The document in ``text``; raises ``yaml.YAMLError`` (with a mark where known)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
        raise DocumentTooLarge(f"the file is over {MAX_DOCUMENT_BYTES // (1024 * 1024)} MiB")
    loader = _StrictLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_expanded_size(root)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _check_expanded_size(root: Node) -> None:
    """Refuse a node graph whose aliases expand past the cap, without expanding it.

    Aliases make the composed nodes a graph sharing subtrees; each node's
    expanded size is counted once (memoised by identity), children first.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # nodes whose children are still being counted: the path from the root
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if not children_done:
            if id(node) in open_nodes:
                # An alias to a node that contains it (``a: &a [*a]``): infinitely large.
                raise DocumentTooLarge(
                    f"an alias refers to a value that contains it (line {node.start_mark.line + 1}); "
                    "write the values out instead"
                )
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        open_nodes.discard(id(node))
        total = 1 + sum(sizes.get(id(child), 0) for child in children)
        if total > MAX_EXPANDED_NODES:
            raise DocumentTooLarge(
                f"its aliases expand to more than {MAX_EXPANDED_NODES} values "
                f"(line {node.start_mark.line + 1}); write the values out instead"
            )
        sizes[id(node)] = total


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []
