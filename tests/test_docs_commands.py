"""The command lines an operator copies from README.md and docs/deploy.md exist.

Every `bpm ...` command in a fenced code block must name a subcommand path the CLI has,
and every option written on it must be listed by that subcommand's `--help`; every script
path named in those blocks must be a file of the repository. Placeholders (`<name>`,
`$VAR`) stand for values and are not checked. Only `--help` runs: no Spark, no server.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from unittest import mock

import pytest
import typer.main
import typer.rich_utils
from typer.testing import CliRunner

from bpm_app.cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/deploy.md", "docs/queries.md")
WIDTH = 250  # wide enough that no help line is cut

FENCE = re.compile(r"^\s*(```|~~~)")
PLACEHOLDER = re.compile(r"<[^<>\n]*>")
MENTIONS_BPM = re.compile(r"(?:^|[\s;&|(])(?:\S*/)?bpm(?:\s|$)")
SCRIPT = re.compile(r"(?<![\w./-])((?:\./)?scripts/[\w./-]*[\w-])")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OPTION = re.compile(r"^--?[A-Za-z][\w-]*")
WRAPPERS = {"sudo", "exec", "nohup", "env", "time", "command"}


@dataclass(frozen=True)
class Command:
    """One `bpm` command line found in a document: the arguments after `bpm`."""

    where: str
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: bpm {' '.join(self.args)}"


def code_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block, continuations joined."""
    lines, inside, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((start, pending + line))
        pending = ""
    return lines


def _segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line: its words, split at pipes, lists and subshells."""
    lexer = shlex.shlex(PLACEHOLDER.sub("PLACEHOLDER", line), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    segments: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set("();<>|&"):
            segments.append([])
        else:
            segments[-1].append(token)
    return [s for s in segments if s]


def _bpm_args(words: list[str]) -> list[str] | None:
    """The arguments after `bpm` when this simple command runs bpm (after variable
    assignments, `sudo`-like wrappers or `docker-compose exec SERVICE`), else None."""
    i = 0
    while i < len(words):
        word = words[i]
        if ASSIGNMENT.match(word) or word in WRAPPERS:
            i += 1
        elif word in ("docker-compose", "docker") and "exec" in words[i:i + 3]:
            i = words.index("exec", i) + 1
            while i < len(words) and words[i].startswith("-"):
                i += 1
            i += 1  # the service
        else:
            break
    if i < len(words) and Path(words[i]).name == "bpm":
        return words[i + 1:]
    return None


def extract(text: str, name: str = "<text>") -> list[Command]:
    """Every bpm command in the fenced code blocks of a Markdown text."""
    found = []
    for number, line in code_blocks(text):
        if not MENTIONS_BPM.search(line):
            continue
        where = f"{name}:{number}"
        try:
            segments = _segments(line)
        except ValueError as exc:  # unbalanced quotes: say so rather than skip the line
            found.append(Command(where, ("<unparsable: " + str(exc) + ">",)))
            continue
        for words in segments:
            args = _bpm_args(words)
            if args is not None:
                found.append(Command(where, tuple(args)))
    return found


def scripts(text: str) -> list[str]:
    """Every script path named in the fenced code blocks of a Markdown text."""
    return [m.group(1) for _, line in code_blocks(text) for m in SCRIPT.finditer(line)]


@cache
def help_text(path: tuple[str, ...]) -> tuple[int, str]:
    """Exit code and output of `bpm PATH --help`, on a wide console."""
    with mock.patch.object(typer.rich_utils, "MAX_WIDTH", WIDTH):
        result = CliRunner().invoke(app, [*path, "--help"], terminal_width=WIDTH)
    return result.exit_code, result.output


def problems(command: Command) -> list[str]:
    """What does not exist of a command: a subcommand, or options its --help does not list."""
    args = list(command.args)
    if args and args[0].startswith("<unparsable"):
        return [f"{command.where}: cannot read the line ({args[0]})"]
    group = typer.main.get_command(app)
    path: list[str] = []
    while hasattr(group, "commands") and args and not args[0].startswith("-"):  # a group of subcommands
        sub = group.commands.get(args[0])
        if sub is None:
            return [f"{command}: `{' '.join(['bpm', *path])}` has no subcommand {args[0]!r}"]
        path.append(args.pop(0))
        group = sub
    name = " ".join(["bpm", *path])
    code, text = help_text(tuple(path))
    if code != 0:
        return [f"{command}: `{name} --help` exited with {code}"]
    out = []
    for word in args:
        match = OPTION.match(word)
        if match is None:
            continue
        option = match.group(0)
        if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text):
            out.append(f"{command}: `{name}` has no option {option}")
    return out


def _documents() -> list[tuple[str, str]]:
    return [(name, (ROOT / name).read_text()) for name in DOCUMENTS]


COMMANDS = [c for name, text in _documents() for c in extract(text, name)]


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_documented_command_exists(command):
    assert problems(command) == []


def test_the_documents_have_commands_to_check():
    places = {c.where.split(":")[0] for c in COMMANDS}
    assert places == set(DOCUMENTS), "a document lost its commands, or the extractor finds none"


@pytest.mark.parametrize("name", DOCUMENTS)
def test_documented_scripts_exist(name):
    missing = [path for path in scripts((ROOT / name).read_text()) if not (ROOT / path).is_file()]
    assert missing == []


def test_documented_agent_configuration_files_are_valid(tmp_path):
    """Every TOML block of the documents is a file `bpm agent run --config` takes."""
    from spark_agents.settings import AgentSettings

    blocks = [block for _, text in _documents() for block in re.findall(r"```toml\n(.*?)```", text, re.S)]
    assert blocks, "the deployment guide shows an agent's configuration file"
    for block in blocks:
        config = tmp_path / "agent.toml"
        config.write_text(block)
        AgentSettings.load(config)


SAMPLE = """
Outside a block `bpm nosuch --wrong` is prose, not a command.

```bash
bpm registry serve --port 8000 --no-such-option   # a comment: --ignored
export X=1 && bpm participants add <name> --endpoint http://$HOST:9000 \\
    --registry "$URL" --json | jq .
bpm registry vacuum --database-url x
key=$(docker-compose exec -T registry bpm participants add a --endpoint http://a:9000 --wrong-too)
.venv/bin/bpm demo --headless --workdir=/tmp/run --no-hosts
scripts/bootstrap.sh && scripts/no-such-script.sh
```
"""


def test_the_extractor_finds_every_command_and_reports_what_does_not_exist():
    commands = extract(SAMPLE, "sample")
    assert [c.args for c in commands] == [
        ("registry", "serve", "--port", "8000", "--no-such-option"),
        ("participants", "add", "PLACEHOLDER", "--endpoint", "http://$HOST:9000", "--registry", "$URL", "--json"),
        ("registry", "vacuum", "--database-url", "x"),
        ("participants", "add", "a", "--endpoint", "http://a:9000", "--wrong-too"),
        ("demo", "--headless", "--workdir=/tmp/run", "--no-hosts"),
    ]
    found = [problems(c) for c in commands]
    assert len(found[0]) == 1 and "has no option --no-such-option" in found[0][0]
    assert found[1] == []
    assert len(found[2]) == 1 and "has no subcommand 'vacuum'" in found[2][0]
    assert len(found[3]) == 1 and "has no option --wrong-too" in found[3][0]
    assert found[4] == []
    assert [p for p in scripts(SAMPLE) if not (ROOT / p).is_file()] == ["scripts/no-such-script.sh"]


def test_an_option_is_told_from_a_longer_one_that_starts_alike():
    # `--ha` exists on `bpm agent run`, `--ha-mode` does not (it is `bpm contracts propose`'s).
    assert problems(Command("sample", ("agent", "run", "--ha"))) == []
    assert problems(Command("sample", ("agent", "run", "--ha-mode", "none"))) != []


def test_the_shell_scripts_are_executable():
    """The scripts call one another directly (`scripts/test.sh --full` execs scripts/nightly.sh)."""
    scripts = sorted(ROOT.glob("scripts/*.sh")) + [ROOT / ".ci" / "run"]
    assert [s.relative_to(ROOT).as_posix() for s in scripts if not os.access(s, os.X_OK)] == []
