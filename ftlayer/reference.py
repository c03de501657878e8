"""``docs/configuration.md``: every setting of ftlayer, its default and its meaning, generated
from the code and never edited by hand.

    python -m ftlayer.reference            # print the page
    python -m ftlayer.reference --write    # (re)write docs/configuration.md
    python -m ftlayer.reference --check    # exit 1, with a short diff, if it is out of date

What it guarantees:

* every field of ``FTConfig``, ``ErrorPolicy`` and ``RateMicroBatchSource`` (read with
  ``dataclasses.fields``) and every parameter of ``FaultTolerance(...)``,
  ``FaultTolerance.pipeline``, each ``Pipeline`` builder method (any public method that
  returns a ``Pipeline``, so a new one is listed without anyone adding it here),
  ``DeltaSink``, ``PostgresSink`` and ``FileSource`` (read with ``inspect.signature``) has a
  row: its name, its type as annotated (a ``Literal`` spelled as its values), its default as
  ``repr`` (or *required*), and its meaning;
* a meaning comes from the code only: a field's attribute docstring (the string literal
  right after it, read from the class's source with ``ast``) or a comment on or right above
  it; else the parameter's entry in a docstring (``name``: text), else the first sentence
  of a docstring that names it as code (``name``, ``name=...``, ``name(...)``). A setting
  with no meaning anywhere fails the generation (:class:`MissingMeaningError`, naming every
  such setting): nobody adds a setting without saying what it does;
* the command-line table lists every visible flag of the ``ftlayer`` parser whose
  destination is an ``FTConfig`` field, the commands that take it and its ``FTLAYER_*``
  variable, read from the parser itself; the settings fixed per namespace are
  ``ftlayer.settings.CHECKED``'s;
* the output depends on the code only (not on the environment: flag defaults, which
  ``FTLAYER_*`` variables change, are not printed), in a fixed order, so ``--check`` is
  stable. ``tests/test_configuration_reference.py`` fails while the committed page differs.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import functools
import inspect
import io
import re
import sys
import textwrap
import tokenize
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

__all__ = [
    "COMMAND",
    "DOC_PATH",
    "MissingMeaningError",
    "Row",
    "Table",
    "attribute_docs",
    "dataclass_rows",
    "main",
    "render",
    "signature_rows",
    "tables",
]

COMMAND = "python -m ftlayer.reference --write"
"""The command that regenerates the page."""
DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
"""The committed page (in a source checkout)."""

_CLI_NOT_CONFIG = {
    "--max-replays": "`ftlayer serve`'s override of the replay budget of records that time "
    "out (each record otherwise carries its pipeline's `max_replays`); not `FTConfig`'s",
}
"""Flags whose destination is named like an FTConfig field but that do not set it."""


class MissingMeaningError(Exception):
    """Settings whose meaning is written nowhere in the code; the message names them all."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        super().__init__(
            "no meaning in the code for: " + ", ".join(self.names) + " -- write an attribute "
            "docstring (a string literal right after the field) or a ``name``: entry in the "
            "function's or class's docstring"
        )


@dataclass(frozen=True)
class Row:
    """One setting: its name, type, default (a ``repr``, or ``required``) and meaning
    (Markdown, one line)."""

    name: str
    type: str
    default: str
    meaning: str


@dataclass(frozen=True)
class Table:
    """One object's settings under a heading, with a line saying what the object is."""

    heading: str
    level: int
    about: str
    rows: tuple[Row, ...]


# -- reading the code ----------------------------------------------------------------------


def attribute_docs(cls: type) -> dict[str, str]:
    """Each field of ``cls``'s body with its meaning: the string literal right after it
    (an attribute docstring), else a comment on its line or on the lines right above it."""
    return dict(_attribute_docs(cls))


_PRAGMA = re.compile(r"(fmt|type|noqa|pragma|mypy)\b")
"""Comments that are tools' pragmas (``# fmt: skip``), not meanings."""


@functools.lru_cache(maxsize=64)
def _attribute_docs(cls: type) -> dict[str, str]:
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        text = tok.string.lstrip("#").strip()
        if tok.type == tokenize.COMMENT and not _PRAGMA.match(text):
            comments[tok.start[0]] = text
    body = typing.cast(ast.ClassDef, ast.parse(source).body[0]).body
    docs: dict[str, str] = {}
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name)):  # fmt: skip
            name = node.targets[0].id
        else:
            continue
        nxt = body[i + 1] if i + 1 < len(body) else None
        if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):  # fmt: skip
            docs[name] = inspect.cleandoc(nxt.value.value)
            continue
        end = node.end_lineno or node.lineno
        said = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
        above = node.lineno - 1
        while above in comments and lines[above - 1].lstrip().startswith("#"):
            said.insert(0, comments[above])
            above -= 1
        if said:
            docs[name] = " ".join(said)
    return docs


_CODE = re.compile(r"``(.+?)``")
_ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc):`~?([^`]+)`")
_SENTENCE_END = re.compile(r"(?<=[.!?])(?<!e\.g\.)(?<!i\.e\.)\s+(?=[A-Z(\"*\x00])")
_DEFINITION = re.compile(r"\x00(\d+)\x00:\s")


@dataclass(frozen=True)
class _Text:
    """A docstring as sentences, its code spans replaced by ``\\x00<n>\\x00``."""

    sentences: tuple[str, ...]
    code: tuple[str, ...]

    @classmethod
    def of(cls, doc: str | None) -> _Text:
        code: list[str] = []

        def hide(m: re.Match[str]) -> str:
            code.append(m.group(1))
            return f"\x00{len(code) - 1}\x00"

        sentences: list[str] = []
        for para in re.split(r"\n\s*\n", inspect.cleandoc(doc or "")):
            lines = para.splitlines()
            if not lines or all(line[:1].isspace() for line in lines):
                continue  # a literal block (an example)
            items: list[list[str]] = [[]]  # a list's items apart: "* item" lines
            for line in lines:
                if re.match(r"\s*[*-] ", line) and items[-1]:
                    items.append([])
                items[-1].append(re.sub(r"^\s*[*-] ", "", line).strip())
            for item in items:
                text = _ROLE.sub(lambda m: f"``{m.group(1).split('.')[-1]}``", " ".join(item))
                text = _CODE.sub(hide, text)
                sentences += [s for s in _SENTENCE_END.split(text) if s]
        return cls(tuple(sentences), tuple(code))

    def names(self, i: int, param: str) -> bool:
        """Code span ``i`` names ``param`` (``p``, ``*p``, ``p=...``, ``p(...)``)."""
        return re.match(rf"[*(]*{re.escape(param)}(?![\w.])", self.code[i]) is not None

    def definitions(self, param: str) -> list[str]:
        """The ``param``: entries of the text, each up to the next entry, the end of its
        sentence or an unmatched ``)``; labelled when the entry is ``param=value``."""
        found = []
        for s in self.sentences:
            for m in _DEFINITION.finditer(s):
                i = int(m.group(1))
                if not self.names(i, param):
                    continue
                rest = s[m.end():]
                nxt = re.search(r";\s+\x00\d+\x00:\s", rest)
                if nxt:
                    rest = rest[: nxt.start()]
                depth = 0
                for j, ch in enumerate(rest):
                    depth += {"(": 1, ")": -1}.get(ch, 0)
                    if depth < 0:
                        rest = rest[:j]
                        break
                text = self.show(rest.strip().rstrip(";,").strip())
                label = self.code[i].lstrip("*(")
                found.append(text if label == param else f"`{label}`: {text}")
        return found

    def mention(self, param: str) -> str | None:
        """The first sentence naming ``param`` as code."""
        for s in self.sentences:
            for m in re.finditer(r"\x00(\d+)\x00", s):
                if self.names(int(m.group(1)), param):
                    return self.show(s)
        return None

    def show(self, text: str) -> str:
        """``text`` with its code spans back, in Markdown."""
        return re.sub(r"\x00(\d+)\x00", lambda m: _md_code(self.code[int(m.group(1))]), text)

    def summary(self) -> str:
        """The first sentence that is not a pointer elsewhere ("See the module ...")."""
        said = [s for s in self.sentences if not s.startswith("See ")]
        if len(said) > 1 and len(said[0]) < 30:  # "The last stage."
            return self.show(f"{said[0]} {said[1]}")
        return self.show(said[0]) if said else ""


def _md_code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _first(doc: str | None) -> str:
    return _Text.of(doc).summary()


Source = type | str | None
"""Where meanings are looked up: a class (its attribute docstrings) or a docstring."""


def _meaning(param: str, sources: Sequence[Source]) -> str | None:
    """``param``'s meaning: an attribute docstring of a class among ``sources``, else its
    entries in their docstrings, else the first sentence of one that names it."""
    said: str | None = None
    for src in sources:
        if isinstance(src, type) and attribute_docs(src).get(param):
            doc = _Text.of(attribute_docs(src)[param])
            said = doc.show(" ".join(doc.sentences))
            break
    texts = [_Text.of(src) for src in sources if isinstance(src, str)]
    for text in texts if said is None else ():
        found = text.definitions(param)
        if found:
            said = "; ".join(found)
            break
    for text in texts if said is None else ():
        said = text.mention(param)
        if said:
            break
    if not said:
        return None
    return said if said.endswith((".", "!", "?")) else f"{said}."


def _type(annotation: Any, scope: dict[str, Any]) -> str:
    """An annotation as written, a Literal (or a name bound to one) as its values."""
    if annotation is inspect.Parameter.empty:
        return ""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    try:
        value = eval(text, scope)  # noqa: S307 (an annotation of ftlayer's own code)
    except Exception:  # a name imported under TYPE_CHECKING only
        return text
    if typing.get_origin(value) is typing.Literal:
        return " | ".join(repr(v) for v in typing.get_args(value))
    return text


def _repr(value: Any, where: str) -> str:
    text = repr(value)
    if " at 0x" in text:
        raise ValueError(f"{where}: the default {text} has no stable repr")
    return text


def dataclass_rows(cls: type, sources: Sequence[Source] = ()) -> list[Row]:
    """A row per field of dataclass ``cls`` (``dataclasses.fields``), meanings from its
    attribute docstrings, then ``sources``."""
    scope = vars(sys.modules[cls.__module__])
    rows, missing = [], []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = _repr(f.default, f"{cls.__name__}.{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            default = _repr(f.default_factory(), f"{cls.__name__}.{f.name}")
        else:
            default = "required"
        meaning = _meaning(f.name, [cls, *sources])
        if meaning is None:
            missing.append(f"{cls.__qualname__}.{f.name}")
            continue
        rows.append(Row(f.name, _type(f.type, scope), default, meaning))
    if missing:
        raise MissingMeaningError(missing)
    return rows


def signature_rows(fn: Callable[..., Any], sources: Sequence[Source], where: str) -> list[Row]:
    """A row per parameter of ``fn`` (``inspect.signature``; not ``self``), meanings from
    ``sources``."""
    scope = getattr(fn, "__globals__", None) or vars(sys.modules[fn.__module__])
    rows, missing = [], []
    for p in inspect.signature(fn).parameters.values():
        if p.name in ("self", "cls"):
            continue
        name = _param_name(p)
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            default = ""
        elif p.default is p.empty:
            default = "required"
        else:
            default = _repr(p.default, f"{where}({p.name})")
        meaning = _meaning(p.name, sources)
        if meaning is None:
            missing.append(f"{where}({name})")
            continue
        rows.append(Row(name, _type(p.annotation, scope), default, meaning))
    if missing:
        raise MissingMeaningError(missing)
    return rows


# -- what the page holds -------------------------------------------------------------------


def _builders(cls: type) -> list[Callable[..., Any]]:
    """The public methods of ``cls`` that return a ``cls`` (builders), in source order."""
    found = []
    for name, fn in vars(cls).items():
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        if inspect.signature(fn).return_annotation in (cls.__name__, cls):
            found.append(fn)
    return sorted(found, key=lambda f: f.__code__.co_firstlineno)


def _param_name(p: inspect.Parameter) -> str:
    """``p``'s name as a call spells it: ``*args``, ``**options``."""
    if p.kind == p.VAR_POSITIONAL:
        return f"*{p.name}"
    return f"**{p.name}" if p.kind == p.VAR_KEYWORD else p.name


def _call(name: str, fn: Callable[..., Any]) -> str:
    """``name(a, b, *, c, **d)``: ``fn``'s parameters by name (not ``self``)."""
    shown: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        if p.kind == p.KEYWORD_ONLY and not any(s.startswith("*") for s in shown):
            shown.append("*")
        shown.append(_param_name(p))
    return f"{name}({', '.join(shown)})"


def tables() -> list[Table]:
    """Every table of the page, in order. Raises MissingMeaningError naming every setting whose
    meaning the code does not give."""
    from ftlayer.config import FTConfig
    from ftlayer.sinks import DeltaSink, PostgresSink
    from ftlayer.spark import ErrorPolicy, FaultTolerance, FileSource, KafkaSource, Pipeline
    from ftlayer.spark.references import RateMicroBatchSource

    out: list[Table] = []
    missing: list[str] = []

    def add(heading: str, level: int, about: str, rows: Callable[[], list[Row]]) -> None:
        try:
            out.append(Table(heading, level, about, tuple(rows())))
        except MissingMeaningError as e:
            missing.extend(e.names)

    fixed = _fixed_per_namespace()

    def config_rows() -> list[Row]:
        rows = dataclass_rows(FTConfig)
        return [dataclasses.replace(r, meaning=f"{r.meaning} *Fixed per namespace.*")
                if r.name in fixed else r for r in rows]  # fmt: skip

    add("FTConfig", 2, f"`ftlayer.FTConfig(...)`: {_first(FTConfig.__doc__)} Frozen, "
        "checked when built (a bad value raises `ConfigError`).", config_rows)  # fmt: skip
    init = FaultTolerance.__init__
    add("FaultTolerance", 2, f"`ftlayer.spark.{_call('FaultTolerance', init)}`: "
        f"{_first(FaultTolerance.__doc__)}",
        lambda: signature_rows(init, [init.__doc__, FaultTolerance.__doc__],
                               "FaultTolerance"))  # fmt: skip
    pipe = FaultTolerance.pipeline
    add("FaultTolerance.pipeline", 2, f"`{_call('ft.pipeline', pipe)}`: a new `Pipeline`, "
        "a `foreachBatch` function; its stages and sink are added by the builder methods "
        "below.",
        lambda: signature_rows(pipe, [pipe.__doc__, Pipeline, Pipeline.__doc__],
                               "FaultTolerance.pipeline"))  # fmt: skip
    add("ErrorPolicy", 2, "`ftlayer.spark.ErrorPolicy(...)`: how a stage's exceptions are "
        "met, for a pipeline (`ft.pipeline(errors=...)`) or one stage (`errors=`). "
        f"{_first(ErrorPolicy.__doc__)}",
        lambda: dataclass_rows(ErrorPolicy))  # fmt: skip
    out.append(Table("Pipeline builder methods", 2, "`ft.pipeline(...).<method>(...)`: each "
                     "returns a new `Pipeline`.", ()))  # fmt: skip
    for fn in _builders(Pipeline):
        add(f"`.{_call(fn.__name__, fn)}`", 3, _first(fn.__doc__),
            partial(signature_rows, fn, [fn.__doc__], f"Pipeline.{fn.__name__}"))
    out.append(Table("Sinks", 2, "Idempotent `sink_batches` functions (`ftlayer.sinks`): each "
                     "keeps one row per source record, by its lineage id.", ()))  # fmt: skip
    for sink in (DeltaSink, PostgresSink):
        add(f"`{_call(sink.__qualname__, sink)}`", 3, _first(sink.__doc__),
            partial(signature_rows, sink.__init__, [sink.__init__.__doc__, sink.__doc__],
                    sink.__qualname__))  # fmt: skip
    out.append(Table("Sources kept by reference", 2, "Given to `ft.pipeline(reads=...)` "
                     "(`ftlayer.spark.references`): a record is persisted as a reference to "
                     "its row, which its replays read back.", ()))  # fmt: skip
    add(f"`{_call('FileSource', FileSource)}`", 3, _first(FileSource.__doc__),
        lambda: signature_rows(FileSource.__init__, [FileSource.__doc__], "FileSource"))
    add(f"`{_call('KafkaSource', KafkaSource)}`", 3, _first(KafkaSource.__doc__),
        lambda: signature_rows(KafkaSource.__init__, [KafkaSource.__doc__, KafkaSource],
                               "KafkaSource"))  # fmt: skip
    add(f"`{_call('RateMicroBatchSource', RateMicroBatchSource)}`", 3,
        _first(RateMicroBatchSource.__doc__),
        lambda: dataclass_rows(RateMicroBatchSource, [RateMicroBatchSource.__doc__]))
    if missing:
        raise MissingMeaningError(missing)
    return out


def _fixed_per_namespace() -> list[str]:
    """The FTConfig fields a namespace stores by its first open (ftlayer.settings)."""
    from ftlayer.config import FTConfig
    from ftlayer.settings import CHECKED

    names = {f.name for f in dataclasses.fields(FTConfig)}
    return [n for n in CHECKED if n in names]


def _parsers(
    p: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterable[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every visible command below ``p`` with its path (``("dlq", "list")``)."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            visible = {a.dest for a in action._choices_actions}
            for name, child in action.choices.items():
                if name in visible:
                    yield (*path, name), child
                    yield from _parsers(child, (*path, name))


def cli_rows() -> list[list[str]]:
    """flag | environment variable | what it sets | commands, for every visible flag of
    ``ftlayer`` whose destination is an FTConfig field. A command whose flag has no
    environment fallback is marked so."""
    from ftlayer.cli import build_parser
    from ftlayer.cli.common import env_name
    from ftlayer.config import FTConfig

    fields = {f.name for f in dataclasses.fields(FTConfig)}
    dests: dict[str, str] = {}
    paths: dict[str, dict[tuple[str, ...], bool]] = {}  # flag -> command -> has its env var
    commands = dict(_parsers(build_parser()))
    for path, parser in commands.items():
        for action in parser._actions:
            if action.dest not in fields or action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                if flag.startswith("--"):
                    dests[flag] = action.dest
                    has_env = f"[env: {env_name(flag)}]" in (action.help or "")
                    paths.setdefault(flag, {})[path] = has_env
    stale = sorted(set(_CLI_NOT_CONFIG) - set(dests))
    if stale:
        raise ValueError(f"ftlayer.reference._CLI_NOT_CONFIG names flags the CLI lacks: {stale}")
    rows = []
    for flag in sorted(dests, key=lambda f: (dests[f], f)):
        sets = _CLI_NOT_CONFIG.get(flag, f"`FTConfig.{dests[flag]}`")
        env = f"`{env_name(flag)}`" if any(paths[flag].values()) else "none"
        rows.append([f"`{flag}`", env, sets, _commands(paths[flag], commands)])
    return rows


def _commands(paths: dict[tuple[str, ...], bool],
              commands: dict[tuple[str, ...], argparse.ArgumentParser]) -> str:  # fmt: skip
    """The commands of ``paths`` (a group whose every subcommand is there as ``group *``),
    those without the environment fallback marked."""
    shown = []
    for top in sorted({p[0] for p in paths}):
        children = [c for c in commands if len(c) == 2 and c[0] == top]
        if children and all(paths.get(c) for c in children):
            shown.append(f"`{top} *`")
            continue
        for path in sorted(p for p in paths if p[0] == top):
            shown.append(f"`{' '.join(path)}`" + ("" if paths[path] else " (flag only)"))
    return ", ".join(shown)


# -- the page ------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _intro() -> list[str]:
    from ftlayer.cli.common import env_name

    fixed = ", ".join(f"`{n}`" for n in _fixed_per_namespace())
    return [
        "# Configuration reference",
        "",
        f"*Generated from the code by `{COMMAND}` (`ftlayer/reference.py`): do not edit it by "
        "hand. `tests/test_configuration_reference.py` fails while this page differs from what "
        "the code generates; after changing a setting, its default or its docstring, run the "
        "command and commit the page with the change.*",
        "",
        "Each table lists a setting's name, type, default (as Python's `repr`; *required*: no "
        "default) and meaning, taken from the attribute docstrings and docstrings of the code.",
        "",
        "## How settings are given",
        "",
        "- **In code.** Every setting of the FT layer is a field of `FTConfig`: build it on the "
        "driver, `FaultTolerance(FTConfig(namespace=\"orders\", redis_url=url))`. Executors get "
        "it inside the pickled tasks and read no environment variable. What a pipeline, its "
        "error policy, its sink and its source do is set by the arguments of the calls below.",
        "- **Command line and sidecar.** `ftlayer serve` and the other commands build their "
        "`FTConfig` from flags; each flag falls back to an environment variable, `FTLAYER_` and "
        f"its name (`--redis-url` → `{env_name('--redis-url')}`). The fields without a flag "
        "keep their defaults. The flags that set `FTConfig` fields (`dlq *`: every `dlq` "
        "subcommand; the sidecar's own flags, such as its lease and metrics address, are in "
        "`ftlayer serve --help`):",
        "",
        md_table(["flag", "environment", "sets", "commands"], cli_rows()),
        "",
        f"- **Fixed per namespace.** {fixed} are stored in Redis by the first open of a "
        "namespace (`ftlayer/settings.py`); a later open with other values (a pipeline, a "
        "sidecar, a command) is refused, and a command not given them takes the stored ones.",
        "",
    ]


def render() -> str:
    """The page. Raises MissingMeaningError naming every setting the code gives no meaning."""
    parts = _intro()
    for t in tables():
        parts += ["#" * t.level + " " + t.heading, "", t.about, ""]
        if t.rows:
            rows = [[f"`{r.name}`", f"`{r.type}`" if r.type else "", f"`{r.default}`"
                     if r.default not in ("", "required") else r.default and "*required*",
                     r.meaning] for r in t.rows]  # fmt: skip
            parts += [md_table(["name", "type", "default", "meaning"], rows), ""]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ftlayer.reference",
                                 description=(__doc__ or "").split("\n\n")[0])  # fmt: skip
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="write the page")
    what.add_argument("--check", action="store_true",
                      help="write nothing; exit 1 if the page differs from what the code "
                           "generates")  # fmt: skip
    ap.add_argument("--output", type=Path, default=DOC_PATH,
                    help="the page's path for --write and --check (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        text = render()
    except MissingMeaningError as e:
        print(f"ftlayer.reference: {e}", file=sys.stderr)
        return 1
    if args.check:
        old = args.output.read_text() if args.output.exists() else ""
        if old == text:
            print(f"{args.output} is up to date")
            return 0
        diff = difflib.unified_diff(old.splitlines(), text.splitlines(),
                                    f"{args.output} (committed)", f"{args.output} (generated)",
                                    lineterm="", n=1)  # fmt: skip
        lines = list(diff)
        print("\n".join(lines[:40] + ([f"... ({len(lines) - 40} more lines)"]
                                      if len(lines) > 40 else [])))  # fmt: skip
        print(f"\n{args.output} is out of date: run `{COMMAND}`", file=sys.stderr)
        return 1
    if args.write:
        args.output.write_text(text)
        print(f"wrote {args.output}")
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
