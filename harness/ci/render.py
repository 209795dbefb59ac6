"""The files under harness/ci/templates/, rendered by Jinja2: ``render_template(name, **values)``.

The templates are the generated files themselves (workflows, Dockerfile, bake file, tox section) with Jinja's
marks changed, so that GitHub's own ``${{ }}`` expressions pass through untouched:

- ``<%= value %>``: a value (Jinja's ``{{ value }}``, which ``${{ github.ref }}`` would otherwise trip);
- ``#{% if ... %}``, ``#{% for ... %}``, ``#{% include ... %}``: a statement, on a line of its own, which the
  rendering removes whole (to YAML, a Dockerfile, HCL and tox.ini the line is a comment, so a template still
  reads as the file it makes);
- ``#{# ... #}``: a comment the output leaves out.

Rendering is strict (an undefined value is an error, not an empty string), keeps each file's trailing newline
and escapes nothing (these are not HTML). Filters beside Jinja's own: ``yaml`` (a string as a quoted YAML
scalar, a number as it is) and ``yaml_plain`` (a plain YAML scalar where one reads back as the same string,
else quoted).

Jinja2 comes with ``keras-harness[ci]``; without it, rendering raises ``harness.extras.MissingExtra``.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any, Union

from harness.errors import InvalidValue
from harness.extras import require

__all__ = ["render_template", "template_names", "yaml_scalar", "yaml_plain"]

PACKAGE = "harness.ci"
FOLDER = "templates"
SYNTAX = {"variable_start_string": "<%=", "variable_end_string": "%>", "block_start_string": "#{%",
          "block_end_string": "%}", "comment_start_string": "#{#", "comment_end_string": "#}"}

# A string YAML (1.1 and 1.2) reads back as itself when written plain, in block and flow context alike.
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
_YAML_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}


def yaml_scalar(value: Union[str, int]) -> str:
    """``value`` as a YAML scalar: a number as it is, a string double-quoted (JSON's quoting is YAML's)."""
    return str(value) if isinstance(value, int) else json.dumps(value)


def yaml_plain(value: str) -> str:
    """``value`` unquoted where YAML reads that back as the same string (``main``), else double-quoted."""
    return value if _PLAIN.match(value) and value.lower() not in _YAML_WORDS else json.dumps(value)


def template_names() -> list[str]:
    """The templates shipped in the package (harness/ci/templates/*.j2), partials (``_*.j2``) included."""
    folder = resources.files(PACKAGE).joinpath(FOLDER)
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".j2"))


@cache
def _environment() -> Any:
    jinja2 = require("jinja2", package="Jinja2 (jinja2)", extra="ci", purpose="rendering harness' CI templates")
    env = jinja2.Environment(loader=jinja2.PackageLoader(PACKAGE, FOLDER), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False, trim_blocks=True, lstrip_blocks=True,
                             **SYNTAX)
    env.filters.update(yaml=yaml_scalar, yaml_plain=yaml_plain)
    return env


def render_template(name: str, **values: Any) -> str:
    """The template ``name`` (``"harness-ci.yml.j2"``, under harness/ci/templates/) rendered with ``values``.

    Raises:
        MissingExtra: Jinja2 is not installed (``pip install 'keras-harness[ci]'``).
        InvalidValue: no template ``name`` (the message lists the known ones), or a value the template uses
            that ``values`` lacks (named).
    """
    env = _environment()
    import jinja2  # loaded by _environment

    try:
        return str(env.get_template(name).render(**values))
    except jinja2.TemplateNotFound as err:
        if err.name != name:
            raise  # a missing include: a broken package, not a bad name
        raise InvalidValue(f"no CI template {name!r} in harness/ci/templates (known: "
                           f"{', '.join(n for n in template_names() if not n.startswith('_'))})") from None
    except jinja2.UndefinedError as err:
        raise InvalidValue(f"template {name!r}: {err.message} (render_template needs it as a keyword)") from None
