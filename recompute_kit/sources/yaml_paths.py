"""Key paths inside a loaded YAML document, shared by the YAML readers and the Hydra overrides."""

from __future__ import annotations

from typing import Any

Path = tuple  # a key path inside the YAML: ("model", "optim", "name")


def dotted(p: Path) -> str:
    return ".".join(str(k) for k in p)


def lookup(data: Any, p: Path) -> tuple[bool, Any]:
    node = data
    for key in p:
        in_dict = isinstance(node, dict) and key in node
        if in_dict or (isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)):
            node = node[key]
        else:
            return False, None
    return True, node
