"""mkdocs hook: the reference pages, generated from the code at build time.

Each reference page under ``docs/reference/`` holds a marker (``<!-- reference:config -->``,
``<!-- reference:cli -->``, ``<!-- reference:mlflow -->``; ``<!-- reference:features -->`` on
the data-flow page) that :func:`on_page_markdown` replaces with Markdown built here:

- **config**: the default config composed with Hydra's compose API (``conf/ensemble.yaml``: the
  training config plus the ``ensemble``, ``paper`` and ``roll`` groups), every key with its default, the rule of the
  pydantic schema (``foxhunt.config.schema``; ``model.module.*`` by the family's hyperparameter
  definition, see ``foxhunt.config.model_schemas``) and the comment that documents it in the
  YAML file or the schema; then every model family's hyperparameters (type, range, default of
  ``conf/model/<family>.yaml``, one line of doc, the rules between them: from its definition);
  then every config group with its options (the YAML files of ``conf/<group>/``).
- **cli**: the ``foxhunt`` typer app as click commands (help, usage, arguments, options),
  recursively.
- **mlflow**: the tag names of ``foxhunt.runs.tags`` and other modules, and the metric names
  the code writes.
- **features**: the features per bar (``FEATURE_GROUPS`` of ``foxhunt.data.features``).

It imports foxhunt from the environment mkdocs runs in (the project's venv), and needs no GPU,
network or data file: nothing is trained, loaded or resolved that reads the machine.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import typing
from pathlib import Path
from typing import Any

MARKER = re.compile(r"<!--\s*reference:(?P<name>[a-z]+)\s*-->")


def on_pre_build(config) -> None:  # noqa: ARG001 - mkdocs hook signature
    """Forget what an earlier build read (``mkdocs serve`` rebuilds in the same process)."""
    for value in list(globals().values()):
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - mkdocs hook signature
    def fill(match: re.Match) -> str:
        name = match.group("name")
        if name not in BUILDERS:
            raise ValueError(f"{page.file.src_path}: unknown reference marker {name!r} (known: {', '.join(BUILDERS)})")
        return BUILDERS[name]()

    return MARKER.sub(fill, markdown)


# --------------------------------------------------------------------------------------------
# Markdown helpers


def esc(text: str) -> str:
    """Plain text made safe for a Markdown table cell (no HTML, emphasis or cell breaks)."""
    text = re.sub(r"\s+", " ", str(text))
    for char, sub in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("\\", "\\\\"), ("*", "\\*"),
                      ("_", "\\_"), ("|", "\\|"), ("[", "\\["), ("]", "\\]"), ("`", "\\`")):  # fmt: skip
        text = text.replace(char, sub)
    return text


def code(text: str) -> str:
    """An inline code span for a table cell (Python-Markdown's tables keep a code span's pipes)."""
    text = " ".join(str(text).split())
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}" if text else ""


SPAN = re.compile(r"(:[a-z]+:`[^`]+`|``[^`]+``|`[^`]+`)")


def prose(text: str) -> str:
    """Text from a docstring or comment: its ``code`` / `code` / :role:`x` spans kept as code,
    the rest escaped."""
    text = " ".join(str(text).split())
    out = []
    for i, part in enumerate(SPAN.split(text)):  # odd parts are the code spans
        if i % 2:
            inner = part.split("`")[1] if part.startswith(":") else part.strip("`")
            out.append(code(inner.lstrip("~")))
        else:
            out.append(esc(part))
    return "".join(out)


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def yaml_value(value: Any) -> str:
    """A config value as YAML writes it, on one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and value == "":
        return "''"
    return str(value)


def flatten(node: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Leaves of a nested mapping (lists and empty mappings are leaves)."""
    if isinstance(node, dict) and node:
        out = []
        for key, value in node.items():
            out += flatten(value, (*prefix, str(key)))
        return out
    return [(prefix, node)]


# --------------------------------------------------------------------------------------------
# YAML files: their comments


KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.@/-]*)\s*:(?:\s+(?P<rest>.*))?$")
PACKAGE_LINE = re.compile(r"^#\s*@package\s+(?P<package>\S+)")


class YamlDoc:
    """A YAML config file's header comment, ``# @package`` line and per-key comments."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.package: str | None = None
        self.header: list[str] = []
        self.comments: dict[tuple[str, ...], str] = {}
        self._parse(path.read_text().splitlines())

    @property
    def summary(self) -> str:
        """The header's first paragraph, up to a blank line or an indented example."""
        first: list[str] = []
        for line in self.header:
            if not line.strip() or line.startswith("  "):
                if first:
                    break
                continue
            first.append(line.strip())
        return " ".join(first)

    def _parse(self, lines: list[str]) -> None:
        index = 0
        while index < len(lines) and lines[index].lstrip().startswith("#"):
            text = lines[index].strip()
            match = PACKAGE_LINE.match(text)
            if match:
                self.package = match.group("package")
            else:
                self.header.append(text[1:][1:] if text.startswith("# ") else text[1:])
            index += 1
        stack: list[tuple[int, str]] = []
        pending: list[str] = []
        last_path: tuple[str, ...] | None = None
        last_indent, last_commented = -1, False
        for line in lines[index:]:
            stripped = line.strip()
            if not stripped:
                pending, last_commented = [], False
                continue
            indent = len(line) - len(line.lstrip())
            if stripped.startswith("#"):
                text = stripped.lstrip("#").strip()
                if last_commented and indent > last_indent and not pending and last_path is not None:
                    self.comments[last_path] += " " + text  # a comment continued on the next lines
                else:
                    pending.append(text)
                continue
            match = KEY_LINE.match(line)
            if stripped.startswith("- ") or not match:
                pending, last_commented = [], False
                continue
            while stack and stack[-1][0] >= indent:
                stack.pop()
            key = match.group("key")
            path = (*(k for _, k in stack), key)
            stack.append((indent, key))
            comment = _trailing_comment(match.group("rest") or "")
            texts = [t for t in (*pending, comment) if t]
            if texts:
                self.comments[path] = " ".join(texts)
            pending, last_path, last_indent, last_commented = [], path, indent, bool(comment)


def _trailing_comment(rest: str) -> str:
    """The ``# comment`` after a YAML value (outside quotes)."""
    quote = None
    for i, char in enumerate(rest):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[i + 1 :].strip()
    return ""


# --------------------------------------------------------------------------------------------
# The config reference


def conf_dir() -> Path:
    import foxhunt

    return Path(foxhunt.__file__).resolve().parent / "conf"


@functools.cache
def composed_ensemble_config() -> tuple[dict[str, Any], dict[str, str | None]]:
    """The default ``conf/ensemble.yaml`` (= ``conf/train.yaml`` + the ensemble, paper and roll groups), unresolved,
    and Hydra's choice per config group."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import foxhunt  # noqa: F401 - registers foxhunt's resolvers

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("ensemble", return_hydra_config=True)
    choices = dict(OmegaConf.to_container(cfg.hydra.runtime.choices))
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra")
    return container, choices


def package_prefix(group: str, doc: YamlDoc, package: str | None = None) -> tuple[str, ...]:
    """Where a group option's keys land in the composed config."""
    package = package or doc.package
    if package == "_global_":
        return ()
    if package and package != "_group_":
        return tuple(package.split("."))
    if group.endswith("/pipeline"):  # pulled in with pipeline@_here_
        return tuple(group.split("/")[:-1])
    return tuple(group.split("/"))


@functools.cache
def comment_map() -> dict[tuple[str, ...], tuple[str, str]]:
    """Composed key -> (comment, file) from the YAML files of the default config."""
    root = conf_dir()
    _, choices = composed_ensemble_config()
    out: dict[tuple[str, ...], tuple[str, str]] = {}
    sources = [("", root / "train.yaml", None), ("", root / "ensemble.yaml", None)]
    for key, option in choices.items():
        if option is None or key.startswith("hydra"):
            continue
        group, _, package = key.partition("@")
        sources.append((group, root / group / f"{option}.yaml", package or None))
    for group, path, package in sources:
        doc = YamlDoc(path)
        prefix = package_prefix(group, doc, package) if group else ()
        for keys, text in doc.comments.items():
            out[(*prefix, *keys)] = (text, str(path.relative_to(root.parent)))
    return out


@functools.cache
def schema() -> dict[str, Any]:
    from foxhunt.config.schema import EnsembleConfig

    return EnsembleConfig.model_json_schema()


def _deref(node: dict[str, Any]) -> dict[str, Any]:
    defs = schema()["$defs"]
    if "$ref" in node:
        return defs[node["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in node:  # a section that may be null
        refs = [n for n in node["anyOf"] if "$ref" in n]
        if len(refs) == 1:
            return _deref(refs[0])
    return node


def schema_node(path: tuple[str, ...]) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON-schema node of a config key, or (None, the section's note) for a key the schema
    leaves open (a ``_target_`` section's constructor arguments)."""
    node: dict[str, Any] = schema()
    for i, part in enumerate(path):
        node = _deref(node)
        props = node.get("properties", {})
        if part in props:
            node = props[part]
            continue
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            node = extra
            continue
        if extra is False:
            return None, "not in the schema"
        return None, ".".join(path[:i])
    return node, None


def describe(node: dict[str, Any]) -> str:
    """A JSON-schema node as a short rule: type, bounds, choices."""
    if "anyOf" in node:
        parts = [describe(n) for n in node["anyOf"]]
        return " or ".join(dict.fromkeys(p for p in parts if p))
    if "$ref" in node:
        return "section"
    if "const" in node:
        return code(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(code(v) for v in node["enum"])
    kind = node.get("type")
    words = {"integer": "int", "number": "number", "string": "string", "boolean": "bool", "null": "null",
             "array": "list", "object": "mapping"}.get(kind, kind or "any")  # fmt: skip
    bounds = []
    for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in node:
            value = node[key]
            bounds.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    if node.get("minLength"):
        bounds.append("non-empty")
    if "pattern" in node:
        bounds.append(f"matching {code(node['pattern'])}")
    if node.get("minItems"):
        bounds.append(f"at least {node['minItems']} item(s)")
    if kind == "array" and "items" in node:
        words = f"list of ({describe(node['items'])})"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        words = f"mapping of {describe(node['additionalProperties'])}"
    bounds = [b.replace("<", "&lt;").replace(">", "&gt;") if not b.startswith(("matching", "`")) else b for b in bounds]
    return words + (" " + ", ".join(bounds) if bounds else "")


def _fstring(node: ast.AST) -> str:
    """A message literal from source: an f-string's fields shown as <field>."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                expr = ast.unparse(value.value).replace("self.", "")
                parts.append(f"<{expr}>")
        return "".join(parts)
    return f"<{ast.unparse(node)}>"


def _raised_rules(function: Any) -> list[tuple[str | None, str]]:
    """(field, message) of every ValueError / _KeyedError a validator raises; the field is None
    for a plain ValueError (the validated field itself), else its name (rendered when computed)."""
    tree = ast.parse(_dedent(inspect.getsource(function)))
    local = {}
    for node in ast.walk(tree):  # rule = "..." then raise ValueError(rule)
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, (ast.Constant, ast.JoinedStr)):
                local[node.targets[0].id] = _fstring(node.value)

    def text(arg: ast.AST) -> str:
        if isinstance(arg, ast.Name) and arg.id in local:
            return local[arg.id]
        return _fstring(arg)

    rules = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
            continue
        name = getattr(node.exc.func, "id", getattr(node.exc.func, "attr", ""))
        args = node.exc.args
        if name == "_KeyedError" and len(args) == 3:
            rules.append((text(args[0]), text(args[2])))
        elif name == "Related" and len(args) == 2:  # a model definition's rule between keys
            rules.append((text(args[0]), text(args[1])))
        elif name == "ValueError" and args:
            rules.append((None, text(args[0])))
    return list(dict.fromkeys(rules))


def _dedent(source: str) -> str:
    import textwrap

    return textwrap.dedent(source)


@functools.cache
def validator_rules() -> tuple[dict[tuple[str, ...], list[str]], dict[tuple[str, ...], list[str]]]:
    """Rules of the schema's validators: per key, and per section (those relating several keys)."""
    per_key: dict[tuple[str, ...], list[str]] = {}
    per_section: dict[tuple[str, ...], list[str]] = {}
    sections = section_classes()
    for path, cls in sections.items():
        decorators = cls.__pydantic_decorators__
        for info in decorators.field_validators.values():
            for _field, message in _raised_rules(info.func):
                for name in info.info.fields:
                    per_key.setdefault((*path, name), []).append(message)
        for info in decorators.model_validators.values():
            for field, message in _raised_rules(info.func):
                if field is not None and re.fullmatch(r"\w+", field):
                    per_key.setdefault((*path, field), []).append(message)
                else:
                    where = ".".join((*path, field)) if field else ".".join(path)
                    per_section.setdefault(path, []).append(f"{where}: {message}" if where else message)
    return per_key, per_section


@functools.cache
def section_classes() -> dict[tuple[str, ...], type]:
    """Config path -> the pydantic class that checks that section."""
    from pydantic import BaseModel

    from foxhunt.config.schema import EnsembleConfig

    out: dict[tuple[str, ...], type] = {}

    def classes_in(annotation: Any) -> list[type]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [c for arg in typing.get_args(annotation) for c in classes_in(arg)]

    def walk(cls: type, path: tuple[str, ...]) -> None:
        out[path] = cls
        for name, info in cls.model_fields.items():
            key = info.alias or name
            for sub in classes_in(info.annotation):
                if typing.get_origin(info.annotation) is dict:
                    continue
                walk(sub, (*path, key))

    walk(EnsembleConfig, ())
    return out


@functools.cache
def schema_comments() -> dict[tuple[str, ...], str]:
    """The ``# comment`` written beside a field in the schema's source."""
    out: dict[tuple[str, ...], str] = {}
    field_line = re.compile(r"^\s+(?P<name>\w+)\s*:[^#]*#\s*(?P<comment>.+)$")
    for path, cls in section_classes().items():
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        for line in source.splitlines():
            match = field_line.match(line)
            if match and match.group("name") in cls.model_fields and "fmt:" not in match.group("comment"):
                info = cls.model_fields[match.group("name")]
                out[(*path, info.alias or match.group("name"))] = match.group("comment").strip()
    return out


def definition_of(target: str) -> Any:
    """The hyperparameters' definition of the model class a ``model.module._target_`` names."""
    import importlib

    module, _, name = str(target).rpartition(".")
    return getattr(importlib.import_module(module), name).hyperparameters


def field_cell(definition: Any, name: str) -> str:
    """A definition's field as the rule column says it: type and range."""
    from foxhunt.config.model_schemas import field_rule

    return esc(field_rule(definition, name).shown) if name in definition.model_fields else ""


def hyperparameter_doc(path: tuple[str, ...], container: dict[str, Any]) -> str:
    """The one line of doc of a ``model.module`` key, from the family's definition ("" elsewhere)."""
    if path[:2] != ("model", "module") or len(path) != 3:
        return ""
    field = definition_of(container["model"]["module"]["_target_"]).model_fields.get(path[2])
    return (field.description or "") if field is not None else ""


def relation_rules(definition: Any) -> list[str]:
    """Messages of the rules between a family's hyperparameters (its definition's model
    validators, the inherited ones first)."""
    rules = []
    for info in definition.__pydantic_decorators__.model_validators.values():
        for key, message in _raised_rules(info.func):
            rules.append(f"model.module.{key}: {message}")
    return rules


@functools.cache
def hash_exclusions() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from foxhunt.runs.config_hash import HASH_IGNORED, HASH_MASKED

    return HASH_IGNORED, HASH_MASKED


def hashed(path: tuple[str, ...]) -> bool:
    ignored, masked = hash_exclusions()
    dotted = ".".join(path)
    return not any(dotted == k or dotted.startswith(k + ".") for k in (*ignored, *masked))


def rule_cell(path: tuple[str, ...], container: dict[str, Any]) -> str:
    node, open_section = schema_node(path)
    per_key, _ = validator_rules()
    parts = []
    if node is not None:
        parts.append(describe(node))
    elif open_section == "not in the schema":
        parts.append("not checked by the schema")
    else:
        section = tuple(open_section.split(".")) if open_section else ()
        target = _get(container, (*section, "_target_"))
        name = path[len(section)] if len(path) > len(section) else path[-1]
        if section == ("model", "module"):
            parts.append(field_cell(definition_of(target), name) if target else "")
            parts.append(f"an argument of {code(str(target).rsplit('.', 1)[-1])}" if target else "")
        elif target:
            parts.append(f"passed to {code(str(target).rsplit('.', 1)[-1])}")
    parts += [f"refused with: {esc(m)}" for m in per_key.get(path, [])]
    if not hashed(path):
        parts.append("*not in the config hash*")
    return "; ".join(p for p in parts if p)


def _get(container: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = container
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


SECTION_TITLES = {
    "": "Top level",
}


def config_reference() -> str:
    container, choices = composed_ensemble_config()
    comments = comment_map()
    field_comments = schema_comments()
    _, per_section = validator_rules()
    classes = section_classes()
    out = []
    chosen = ", ".join(f"`{k}={v}`" for k, v in choices.items() if v is not None and not k.startswith("hydra") and "@" not in k)
    out.append(f"The defaults below are those of `foxhunt-train` with no overrides ({chosen}); "
               "`ensemble.*` exists only in the `foxhunt ensemble` commands' config (`conf/ensemble.yaml`). "
               "Values are shown before interpolation (`${...}`).\n")  # fmt: skip
    leaves = flatten(container)
    top = [(p, v) for p, v in leaves if len(p) == 1]
    groups: dict[str, list[tuple[tuple[str, ...], Any]]] = {}
    for path, value in leaves:
        if len(path) > 1:
            groups.setdefault(path[0], []).append((path, value))
    blocks = [("", top), *groups.items()]
    for section, rows in blocks:
        title = SECTION_TITLES.get(section, f"`{section}`")
        out.append(f"## {title}\n")
        cls = classes.get((section,) if section else ())
        doc = inspect.getdoc(cls) if cls is not None and cls.__doc__ and section else None
        if doc:
            out.append(prose(doc.split("\n\n")[0]) + "\n")
        files = sorted({comments[p][1] for p, _ in rows if p in comments})
        if files:
            out.append("Documented in " + ", ".join(f"`{f}`" for f in files) + ".\n")
        if section:
            notes = [m for path in classes if path[:1] == (section,) for m in per_section.get(path, [])]
        else:
            notes = list(per_section.get((), []))
        if section == "model":
            notes += relation_rules(definition_of(container["model"]["module"]["_target_"]))
        if section == "model":
            out.append("`model.module.*` is the chosen family's: every family's keys are listed in "
                       "[Model hyperparameters](#model-hyperparameters).\n")  # fmt: skip
        if notes:
            out.append("Checks across keys (the message of each refusal, `<...>`: a value filled in):\n")
            out += [f"- {esc(n)}" for n in dict.fromkeys(notes)]
            out.append("")
        body = []
        for path, value in rows:
            dotted = ".".join(path)
            text = comments.get(path, (field_comments.get(path, ""), ""))[0] or field_comments.get(path, "")
            doc = hyperparameter_doc(path, container)
            text = f"{doc}; {text}" if doc and text else doc or text
            body.append((code(dotted), code(yaml_value(value)), rule_cell(path, container), prose(text)))
        for path, field in unset_fields(section, {p for p, _ in rows}):
            default = "" if field.is_required() else code(yaml_value(field.get_default(call_default_factory=True)))
            body.append((code(".".join(path)), "*unset*" + (f", schema default {default}" if default else ""),
                         rule_cell(path, container), prose(field_comments.get(path, ""))))  # fmt: skip
        out.append(table(("key", "default", "rule", "description"), body) + "\n")
    out.append(model_hyperparameters_reference())
    out.append(groups_reference())
    return "\n".join(out)


def model_hyperparameters_reference() -> str:
    """Every family's ``model.module`` keys from its definition: type, range, one line of doc, the
    default of ``conf/model/<family>.yaml`` and the rules between keys."""
    import yaml

    from foxhunt.config.families import families
    from foxhunt.config.model_schemas import field_rule

    out = ["## Model hyperparameters\n",
           "Each family defines its `model.module` keys once, beside its model: a typed class (type, range, "
           "one line of doc, no default) whose rules between keys are validators "
           "([Add a model family](../how-to/add-a-model-family.md#2-the-config-file)). The config schema validates "
           "`model.module` with it, the model's constructor too; the defaults are those of "
           "`conf/model/<family>.yaml` (shown before interpolation). A refusal is one line, "
           "`model.module.<key>=<value>: must be ...`.\n"]  # fmt: skip
    for name, family in families().items():
        definition = definition_of(family.module)
        module = (yaml.safe_load((conf_dir() / "model" / f"{name}.yaml").read_text()) or {}).get("module", {})
        out.append(f"### `model={name}`\n")
        doc = inspect.getdoc(definition) or ""
        out.append(f"{code(family.module)} ({family.kind}), defined by {code(definition.__module__ + '.' + definition.__name__)}: "
                   + prose(doc.split("\n\n")[0]) + "\n")  # fmt: skip
        rows = []
        for key, field in definition.model_fields.items():
            rule = field_rule(definition, key)
            default = code(yaml_value(module[key])) if key in module else "*not in conf*"
            rows.append((code(key), esc(rule.kind), esc(rule.interval), default, prose(field.description or "")))
        out.append(table(("key", "type", "range", "default", "description"), rows) + "\n")
        relations = relation_rules(definition)
        if relations:
            out.append("Rules between keys (the message of each refusal, `<...>`: a value filled in):\n")
            out += [f"- {esc(rule)}" for rule in relations]
            out.append("")
    return "\n".join(out)


def unset_fields(section: str, present: set[tuple[str, ...]]) -> list[tuple[tuple[str, ...], Any]]:
    """Schema fields of a section that the default config does not set (another option sets them)."""
    if not section:
        return []
    out = []
    for path, cls in section_classes().items():
        if path[:1] != (section,):
            continue
        for name, field in cls.model_fields.items():
            key = (*path, field.alias or name)
            if key in present or any(p[: len(key)] == key for p in present) or (*path, field.alias or name) in section_classes():
                continue
            out.append((key, field))
    return out


def groups_reference() -> str:
    root = conf_dir()
    _, choices = composed_ensemble_config()
    out = ["## Config groups and their options\n",
           "Pick an option with `<group>=<option>` on the command line. Each option is a YAML file "
           "`conf/<group>/<option>.yaml`; a file marked *global* (`# @package _global_`) may set keys anywhere "
           "in the config (and in Hydra's own node, `hydra.*`).\n"]  # fmt: skip
    groups = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir() and any(p.glob("*.yaml")))
    for group in groups:
        default = choices.get(group) or next((v for k, v in choices.items() if k.startswith(group + "@")), None)
        out.append(f"### `{group}`\n")
        if group == "bench":
            out.append("Not a group of `conf/train.yaml`: the benchmark's settings (`scripts/benchmark.py`).\n")
        elif group == "hydra":
            out.append("Hydra's own node (`hydra.*`: output folders, the sweep callback), not in the run's config.\n")
        elif "/" in group:
            parent = group.split("/")[0]
            out.append(f"Not picked on the command line: each `{parent}` option pulls it in through its defaults list.\n")
        elif default:
            out.append(f"Default: `{default}`.\n")
        elif group in choices:
            out.append("Default: none (pick an option to use it).\n")
        rows = []
        for path in sorted((root / group).glob("*.yaml")):
            doc = YamlDoc(path)
            flag = " (global)" if doc.package == "_global_" else ""
            rows.append((code(path.stem) + flag, prose(doc.summary)))
        out.append(table(("option", "what it is"), rows) + "\n")
        for path in sorted((root / group).glob("*.yaml")):
            out.append(option_details(group, path))
    return "\n".join(out)


def option_details(group: str, path: Path) -> str:
    import yaml

    doc = YamlDoc(path)
    data = yaml.safe_load(path.read_text()) or {}
    defaults = data.pop("defaults", None) if isinstance(data, dict) else None
    prefix = package_prefix(group, doc)
    rows = []
    for keys, value in flatten(data):
        if not keys:
            continue
        rows.append((code(".".join((*prefix, *keys))), code(yaml_value(value)), prose(doc.comments.get(keys, ""))))
    lines = [f'??? note "`{group}={path.stem}`: every key"', ""]
    header = [h for h in doc.header]
    if header:
        lines += ["    ```text", *("    " + h for h in header), "    ```", ""]
    if defaults:
        lines.append("    Defaults list: " + ", ".join(code(yaml_value(d)) for d in defaults) + "\n")
    if rows:
        lines += ["    " + line for line in table(("key", "value", "comment"), rows).splitlines()]
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The CLI reference


def cli_reference() -> str:
    import typer

    from foxhunt.cli import app

    command = typer.main.get_command(app)
    ctx = command.context_class(command, info_name="foxhunt")
    out: list[str] = []
    _command(command, ctx, out, level=2)
    return "\n".join(out)


def _command(command, ctx, out: list[str], level: int) -> None:
    path = ctx.command_path
    out.append(f"{'#' * min(level, 4)} `{path}`\n")
    if command.help:
        out.append(_help_text(command.help) + "\n")
    out.append("```text\n" + command.get_usage(ctx) + "\n```\n")
    rows = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        flags, help_text = record
        kind = "argument" if param.param_type_name == "argument" else "option"
        rows.append((code(flags), kind, esc(help_text)))
    if rows:
        out.append(table(("argument / option", "kind", "help"), rows) + "\n")
    subcommands = getattr(command, "commands", None)
    if subcommands:
        listing = []
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            listing.append((code(f"{path} {name}"), esc(sub.get_short_help_str(limit=200))))
        out.append(table(("command", "what it does"), listing) + "\n")
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            _command(sub, sub.context_class(sub, info_name=name, parent=ctx), out, level + 1)


def _help_text(text: str) -> str:
    paragraphs = [" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n")]
    return "\n\n".join(esc(p) for p in paragraphs if p)


# --------------------------------------------------------------------------------------------
# The MLflow reference


def package_dir() -> Path:
    import foxhunt

    return Path(foxhunt.__file__).resolve().parent


def module_of(path: Path) -> str:
    rel = path.relative_to(package_dir().parent).with_suffix("")
    return ".".join(rel.parts)


@functools.cache
def parsed_modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(package_dir().rglob("*.py")):
        out.append((module_of(path), ast.parse(path.read_text(), str(path))))
    return out


@functools.cache
def module_strings() -> list[tuple[str, set[str], set[str]]]:
    """Per module: its string constants, and the tag names of its literal ``set_tag`` calls."""
    out = []
    for module, tree in parsed_modules():
        strings, tags = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 80:
                strings.add(node.value)
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "set_tag" and len(node.args) >= 2:
                arg = (
                    node.args[1] if len(node.args) >= 3 else node.args[0]
                )  # client.set_tag(run_id, name, value) | run.set_tag(name, value)
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    tags.add(arg.value)
        out.append((module, strings, tags))
    return out


def module_constant(name: str) -> tuple[str, Any]:
    """(module, value) of the first module-level literal constant ``name`` in foxhunt's source
    (read, not imported: the module may import torch)."""
    for module, tree in parsed_modules():
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                value = node.value
                if isinstance(value, ast.Call) and getattr(value.func, "id", "") in ("frozenset", "set", "tuple") and value.args:
                    return module, ast.literal_eval(value.args[0])
                return module, ast.literal_eval(value)
    raise LookupError(f"no module-level constant {name} in foxhunt")


def tags_reference() -> str:
    from foxhunt.runs import tags

    source = Path(tags.__file__).read_text().splitlines()
    rows, group, joining = [], "", False
    inside = None
    assign = re.compile(r'^\s+(?P<name>[A-Z_]+)\s*=\s*(?P<value>"[^"]*"|\([^)]*\))\s*(#\s*(?P<note>.*))?$')
    for line in source:
        if line.startswith("class "):
            inside = line.split()[1].split("(")[0].rstrip(":")
            continue
        if inside != "Tag":
            continue
        if line and not line.startswith(" "):
            inside = None
            continue
        stripped = line.strip()
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            group = group + " " + text if joining else text
            joining = True
            continue
        joining = False
        match = assign.match(line)
        if match:
            value = ast.literal_eval(match.group("value"))
            rows.append((code(value), code(f"Tag.{match.group('name')}"), prose(group), prose(match.group("note") or "")))
    out = ["## Run tags\n",
           "Every tag name foxhunt writes or reads, from `foxhunt.runs.tags.Tag` (grouped by who writes them, "
           "as the source comments say):\n",
           table(("tag", "constant", "written by", "note"), rows) + "\n"]  # fmt: skip
    values = []
    for name in ("RUN_KIND_SWEEP", "ROLE_CELL", "ROLE_FOLD", "SOURCE_TYPE_LOCAL", "EXPERIMENT_KIND", "CELL_TAGS"):
        if hasattr(tags, name):
            values.append(
                (
                    code(name),
                    code(
                        yaml_value(list(getattr(tags, name))) if isinstance(getattr(tags, name), tuple) else getattr(tags, name)
                    ),
                )
            )
    if values:
        out += ["Values and sets of tags (`foxhunt.runs.tags`):\n", table(("name", "value"), values) + "\n"]
    params = [(code(yaml_value(list(v)) if isinstance(v, tuple) else v), code(f"Param.{k}"))
              for k, v in vars(tags.Param).items() if k.isupper()]  # fmt: skip
    if params:
        out += ["Params foxhunt reads back (`foxhunt.runs.tags.Param`; every run logs its resolved config "
                "flattened to dotted keys as params):\n", table(("param", "constant"), params) + "\n"]  # fmt: skip
    out += [other_tags()]
    return "\n".join(out)


def other_tags() -> str:
    """Tags named outside foxhunt.runs.tags: module constants named ``*_TAG`` and literal
    ``set_tag(..., "name", ...)`` calls."""
    from foxhunt.runs.tags import Tag

    known = {v for k, v in vars(Tag).items() if k.isupper() and isinstance(v, str)}
    found: dict[str, set[str]] = {}
    for module, tree in parsed_modules():
        if module == "foxhunt.runs.tags":
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                tuples = [t for t in node.targets if isinstance(t, ast.Tuple)]
                pairs = []
                for name in names:
                    pairs.append((name, node.value))
                for target in tuples:
                    if isinstance(node.value, ast.Tuple):
                        pairs += [(getattr(t, "id", ""), v) for t, v in zip(target.elts, node.value.elts)]
                for name, value in pairs:
                    if "TAG" in name and "TAGS" not in name and isinstance(value, ast.Constant) and isinstance(value.value, str):
                        found.setdefault(value.value, set()).add(module)
    for module, _, tags in module_strings():
        for tag in tags:
            found.setdefault(tag, set()).add(module)
    rows = [(code(tag), ", ".join(code(m) for m in sorted(mods))) for tag, mods in sorted(found.items()) if tag not in known]
    if not rows:
        return ""
    return "\n".join(["Tags named in the module that writes them (not in `Tag`):\n",
                      table(("tag", "module"), rows) + "\n"])  # fmt: skip


METRIC_NAME = re.compile(r"^(train|val|test|holdout|memory|sweep|ensemble|progress)(/[a-z0-9_]+)*/?$")


def metrics_reference() -> str:
    from foxhunt.runs.leaderboard import METRIC_DIRECTIONS, METRIC_SPLITS, SELECTION_SPLIT

    # read from the source: importing foxhunt.evaluation pulls in scipy (seconds)
    _, BASELINES = module_constant("BASELINES")
    _, BACKTEST_NAMES = module_constant("BACKTEST_NAMES")
    _, BASELINE_METRICS = module_constant("BASELINE_METRICS")
    _, BASELINE_PREFIX = module_constant("BASELINE_PREFIX")

    out = ["## Metrics\n"]
    splits = ", ".join(f"`{s}/`" for s in METRIC_SPLITS)
    out.append(f"**Every scored split** ({splits}; selection reads only `{SELECTION_SPLIT}/`) carries the shared "
               "backtest's metrics (`foxhunt.evaluation.scoring.BACKTEST_NAMES`), each as `<split>/<name>`:\n")  # fmt: skip
    out.append(", ".join(code(n) for n in sorted(BACKTEST_NAMES)) + ".\n")
    base = ", ".join(code(f"<split>/{BASELINE_PREFIX}{b}/{m}") for b in BASELINES for m in BASELINE_METRICS)
    out.append(f"and for each baseline of `evaluation.baselines` ({', '.join(code(b) for b in BASELINES)}): {base}.\n")
    rows = [(code(name), "higher" if way == "max" else "lower") for name, way in METRIC_DIRECTIONS.items()]
    out.append("**Which way is better** (`foxhunt.runs.leaderboard.METRIC_DIRECTIONS`, by the name after the split; "
               "`foxhunt runs top` and `foxhunt ensemble register` rank by it):\n")  # fmt: skip
    out.append(table(("metric name", "better"), rows) + "\n")
    module, stats = module_constant("PPO_STATS")
    out.append(f"**PPO's training statistics** (`{module}.PPO_STATS`): "
               + ", ".join(code(f"train/{name}") for name in stats) + ".\n")  # fmt: skip
    module, components = module_constant("COMPONENT_METHODS")
    rows = [(code(f"memory/{name}_mb"), prose(text)) for name, text in components.items()]
    out.append(f"**Memory components** (`{module}.COMPONENT_METHODS`), each logged by the memory-budget callback "
               "as `memory/<component>_mb` (MB = MiB):\n")  # fmt: skip
    out.append(table(("metric", "what is counted"), rows) + "\n")
    found: dict[str, set[str]] = {}
    for module, strings, _ in module_strings():
        for text in strings:
            if METRIC_NAME.match(text) and ("/" in text or text == "progress"):
                found.setdefault(text, set()).add(module)
    literal = [(code(name), ", ".join(code(m) for m in sorted(mods))) for name, mods in sorted(found.items())]
    out.append("**Metric names and prefixes written literally in the code** (a scan of every module's string "
               "constants; names built from a prefix, such as `memory/<component>_mb`, are described on this "
               "page's other sections):\n")  # fmt: skip
    out.append(table(("name or prefix", "modules"), literal) + "\n")
    return "\n".join(out)


def mlflow_reference() -> str:
    return tags_reference() + "\n" + metrics_reference()


def features_reference() -> str:
    """The features per bar, by group, with the comment beside each name in the source
    (``FEATURE_GROUPS``, read from the source, not imported)."""
    for module, tree in parsed_modules():
        for node in tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
            if isinstance(target, ast.Name) and target.id == "FEATURE_GROUPS" and isinstance(node.value, ast.Dict):
                path = package_dir().parent / (module.replace(".", "/") + ".py")
                lines = path.read_text().splitlines()
                rows = []
                for key, names in zip(node.value.keys, node.value.values):
                    for element in names.elts:
                        comment = lines[element.lineno - 1].partition("#")[2].strip()
                        rows.append((code(key.value), code(element.value), prose(comment)))
                title = f"The {len(rows)} features per bar (`{module}.FEATURE_GROUPS`, generated from the code):\n"
                return title + "\n" + table(("group", "feature", "what it is"), rows) + "\n"
    raise LookupError("no FEATURE_GROUPS in foxhunt")


BUILDERS = {"config": config_reference, "cli": cli_reference, "mlflow": mlflow_reference, "features": features_reference}
