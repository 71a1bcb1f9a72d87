"""Griffe extension: Sphinx cross-reference roles in docstrings render as inline code.

The code's docstrings name other objects as ``:func:`name```, ``:class:`~pkg.Name``` and so on
(Sphinx roles), which the Google-style parser leaves as text. This turns each into ```name```
(with ``~``, the last dotted part only), so that the API reference reads cleanly; no link is made,
because many names are relative and would not resolve.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|data|mod|meth|attr|obj|exc|const):`(~?)([^`]+)`")


def _plain(m: re.Match) -> str:
    name = m.group(2).strip()
    if m.group(1):
        name = name.rsplit(".", 1)[-1]
    return f"`{name}`"


class SphinxRoles(griffe.Extension):
    """Rewrites Sphinx roles in every docstring that griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_plain, obj.docstring.value)
