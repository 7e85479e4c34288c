"""Every mistake a user can make on the ``plait`` command line ends in one line,
``plait: error: <what>; <what to do>``, and exit 2, before any model call; never a
traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import plait_cli

PROGRAMS = """\
from plait import LLMInference, Module, Predict


class Summarize(Module):
    def __init__(self):
        super().__init__()
        self.llm = LLMInference("llm", "Summarize.")

    def forward(self, text):
        return self.llm(text)


class NeedsArgs(Module):
    def __init__(self, size):
        super().__init__()

    def forward(self, text):
        return text


class FailsToBuild(Module):
    def __init__(self):
        super().__init__()
        raise ValueError("no model configured")  # build-fails


def bad_signature():
    return Predict("text -> ", alias="llm")


answer = 42


class Decides(Module):
    def __init__(self):
        super().__init__()
        self.llm = LLMInference("llm", "Judge.")

    def forward(self, text):
        if self.llm(text):  # decides
            return "yes"
        return "no"


class AsDict(Module):
    def __init__(self):
        super().__init__()
        self.read = Predict("text -> customer", alias="llm")

    def forward(self, text):
        return dict(self.read(text=text))  # as-dict


class WrongInput(Module):
    def __init__(self):
        super().__init__()
        self.read = Predict("text -> customer", alias="llm")

    def forward(self, text):
        return self.read(txt=text)  # wrong-input


def one_argument(output):
    return True
"""

NO_SERVER = (
    '["*"]\nprovider = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\nmax_retries = 0\n'
)
"""Resources whose endpoint answers nothing: a case that reached a model call would fail its
row (exit 1), not stop with exit 2."""


NO_KEY = (
    '[llm]\nprovider = "openai"\nmodel = "gpt-4o-mini"\napi_key_env = "PLAIT_NO_SUCH_API_KEY"\n'
)
"""Resources for OpenAI's own host whose key is nowhere (the variable is unset in the tests)."""


def line_of(marker: str) -> str:
    """Returns ``progs.py:<n>`` for the line of `PROGRAMS` ending in ``# <marker>``."""
    lines = PROGRAMS.splitlines()
    [number] = [i + 1 for i, line in enumerate(lines) if line.endswith(f"# {marker}")]
    return f"progs.py:{number}"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "progs.py").write_text(PROGRAMS)
    (tmp_path / "syntax.py").write_text("x = (\n")
    (tmp_path / "raising.py").write_text('raise RuntimeError("boom at import")\n')
    (tmp_path / "needs_dep.py").write_text("import no_such_dependency_zz\n")
    (tmp_path / "in.jsonl").write_text('{"text": "a", "target": "a"}\n')
    (tmp_path / "body.jsonl").write_text('{"body": "a"}\n')
    (tmp_path / "res.toml").write_text(NO_SERVER)
    (tmp_path / "other.toml").write_text(NO_SERVER.replace('["*"]', '["other"]'))
    (tmp_path / "llm.toml").write_text(NO_SERVER.replace('["*"]', '["llm"]'))
    (tmp_path / "nokey.toml").write_text(NO_KEY)
    (tmp_path / "chain.toml").write_text(
        NO_SERVER.replace('["*"]', "[local]")
        + '[cloud]\nprovider = "anthropic"\nmodel = "claude-x"\n'
        + '[llm]\nfallback = ["local", "cloud"]\n'
    )
    (tmp_path / "broken.toml").write_text('["*"\nprovider = "openai"\n')
    (tmp_path / "wrong.toml").write_text('["*"]\nprovider = "nosuch"\n')
    (tmp_path / "params.json").write_text("not json\n")
    (tmp_path / "others.json").write_text(
        json.dumps({"format": 1, "parameters": {"nope": {"value": "x"}}})
    )
    (tmp_path / "run.json").write_text("[]\n")
    (tmp_path / "ckpt").write_text("a file, not a folder\n")
    return tmp_path


RUN = ("run", "progs.py:Summarize", "-i", "in.jsonl", "-o", "out.jsonl", "-r", "res.toml")
EVAL = ("eval", *RUN[1:])
TRAIN = ("train", "progs.py:Summarize", "--train", "in.jsonl", "--val", "in.jsonl",
         "-r", "res.toml", "--save", "learned.json")  # fmt: skip


def program(spec: str, command: tuple[str, ...] = RUN) -> tuple[str, ...]:
    return (command[0], spec, *command[2:])


NO_KEY_LINE = (
    "the program calls the alias 'llm', whose endpoint 'llm' (openai gpt-4o-mini) needs an "
    "API key: set the environment variable PLAIT_NO_SUCH_API_KEY, or give api_key "
    "([llm] in nokey.toml)"
)

MISTAKES = {
    # an endpoint called that has no API key: every call would fail unsent
    "no key, run": ((*RUN[:-1], "nokey.toml"), NO_KEY_LINE),
    "no key, eval": ((*EVAL[:-1], "nokey.toml"), NO_KEY_LINE),
    "no key, train": ((*TRAIN[:-3], "nokey.toml", *TRAIN[-2:]), NO_KEY_LINE),
    "no key, serve": (
        ("serve", "progs.py:Summarize", "-r", "nokey.toml", "--port", "9"),
        "Summarize calls the alias 'llm', whose endpoint 'llm' (openai gpt-4o-mini) needs",
    ),
    "no key, mcp": (
        ("mcp", "progs.py:Summarize", "-r", "nokey.toml"),
        "Summarize calls the alias 'llm', whose endpoint 'llm' (openai gpt-4o-mini) needs",
    ),
    "no key, one endpoint of a chain": (
        (*RUN[:-1], "chain.toml"),
        "alias 'llm', whose endpoint 'cloud' (anthropic claude-x) needs an API key: set the "
        "environment variable ANTHROPIC_API_KEY, or give api_key ([cloud] in chain.toml)",
    ),
    # the program named on the command line
    "no colon": (program("progs"), "program 'progs' must look like pkg.module:Name"),
    "file not found": (program("nofile.py:S"), "program file nofile.py does not exist"),
    "name not in file": (
        program("progs.py:Missing"),
        "progs.py has no 'Missing'; it defines: Summarize, NeedsArgs",
    ),
    "not a module": (program("progs.py:answer"), "is a int, not a plait Module"),
    "constructor needs arguments": (
        program("progs.py:NeedsArgs"),
        "could not be built with no arguments (missing a required argument: 'size'); "
        "name a function that builds it",
    ),
    "constructor fails": (
        program("progs.py:FailsToBuild"),
        "building it failed: ValueError: no model configured "
        f"({line_of('build-fails')}); fix the program",
    ),
    "bad signature": (
        program("progs.py:bad_signature"),
        "building it failed: SignatureSyntaxError: no output fields after '->'",
    ),
    "syntax error": (
        program("syntax.py:S"),
        "importing syntax.py failed: SyntaxError: '(' was never closed (syntax.py:1)",
    ),
    "raises on import": (
        program("raising.py:S"),
        "importing raising.py failed: RuntimeError: boom at import (raising.py:1); fix",
    ),
    "imports a missing package": (
        program("needs_dep.py:S"),
        "No module named 'no_such_dependency_zz' (needs_dep.py:1); install",
    ),
    "package not found": (program("no_such_pkg_zz:S"), "no module named 'no_such_pkg_zz'"),
    "a data file as the program": (
        program("in.jsonl:S"),
        "in.jsonl is not a .py file nor a module name; name a Python file",
    ),
    "cannot be traced": (
        program("progs.py:Decides"),
        f"Decides ({line_of('decides')}) used a traced value in an `if`/`while` condition",
    ),
    "dict of a prediction": (
        program("progs.py:AsDict"),
        f"AsDict ({line_of('as-dict')}) used a traced value in `dict()`",
    ),
    "forward fails while traced": (
        program("progs.py:WrongInput"),
        "unknown input(s): txt",
    ),
    # resources
    "resources file missing": (
        (*RUN[:-1], "missing.toml"),
        "--resources missing.toml: no such file; check the path (read from ",
    ),
    "resources not TOML": ((*RUN[:-1], "broken.toml"), "broken.toml: invalid TOML"),
    "resources not TOML, what to do": (
        (*RUN[:-1], "broken.toml"),
        "(at line 1, column 5); correct the file there",
    ),
    "resources invalid": ((*RUN[:-1], "wrong.toml"), "unknown provider 'nosuch'"),
    "resources of another type": ((*RUN[:-1], "in.jsonl"), "unknown config file type"),
    "no resources": (RUN[:-2], "Summarize has no resources: pass --resources"),
    "unknown alias": (
        (*RUN[:-1], "other.toml"),
        "the program calls the alias 'llm', which other.toml does not serve (it serves: "
        "'other'); add a table [llm] to it",
    ),
    # data and columns
    "input missing": (
        ("run", "progs.py:Summarize", "-i", "none.jsonl", *RUN[4:]),
        "none.jsonl: no such file; check the path",
    ),
    "column missing": (
        ("run", "progs.py:Summarize", "-i", "body.jsonl", *RUN[4:]),
        "row 0 has no column 'text'",
    ),
    "column option malformed": ((*RUN, "--column", "text"), "must look like ARGUMENT=COLUMN"),
    "column option unknown input": ((*RUN, "--column", "nope=x"), "has no input 'nope'"),
    "unknown output format": (
        ("run", "progs.py:Summarize", "-i", "in.jsonl", "-o", "out.txt", *RUN[6:]),
        "cannot tell the format from the suffix '.txt'; name it .jsonl, .csv or .parquet",
    ),
    # click's own usage errors, on one line too
    "unknown option value": (
        (*RUN, "--input-format", "xml"),
        "Invalid value for '--input-format': 'xml' is not one of",
    ),
    "unknown option": ((*RUN, "--bogus"), "No such option '--bogus'; see 'plait run --help'"),
    "missing option": (RUN[:4], "Missing option '-o' / '--output'"),
    "unknown command": (("frobnicate",), "No such command 'frobnicate'; see 'plait --help'"),
    # files to write
    "output folder missing": (
        ("run", "progs.py:Summarize", "-i", "in.jsonl", "-o", "sub/out.jsonl", *RUN[6:]),
        "--output sub/out.jsonl: the folder sub does not exist; create it",
    ),
    "report folder missing": (
        (*RUN, "--report", "sub/r.json"),
        "--report sub/r.json: the folder sub does not exist",
    ),
    "trace folder missing": (
        (*RUN, "--trace", "sub/t.json"),
        "--trace sub/t.json: the folder sub does not exist",
    ),
    "checkpoint dir is a file": (
        (*RUN, "--checkpoint-dir", "ckpt"),
        "--checkpoint-dir ckpt is a file; name a folder",
    ),
    # parameters
    "load not a parameter file": (
        (*RUN, "--load", "params.json"),
        "--load params.json: params.json is not a plait parameter file",
    ),
    "load of another program": (
        (*RUN, "--load", "others.json"),
        "--load others.json: unknown parameter(s) in state_dict: nope; known: llm.system_prompt",
    ),
    # eval
    "metric unknown": (
        (*EVAL, "--metric", "nosuch"),
        "metric 'nosuch' is neither exact_match nor contains; name your own as "
        "pkg.module:function or path/to/file.py:function",
    ),
    "metric of the wrong shape": (
        (*EVAL, "--metric", "progs.py:one_argument"),
        "metric 'progs.py:one_argument' must take (output, target); it takes (output)",
    ),
    "target column missing": ((*EVAL, "--target", "label"), "no column 'label' to score against"),
    # train
    "save missing": (TRAIN[:-2], "--save is missing: name the file the trained parameters go"),
    "save folder missing": (
        (*TRAIN[:-1], "sub/learned.json"),
        "--save sub/learned.json: the folder sub does not exist",
    ),
    "optimizer alias unknown": (
        (*TRAIN[:7], "llm.toml", *TRAIN[8:], "--optimizer-alias", "judge"),
        "the optimizer calls the alias 'judge', which llm.toml does not serve",
    ),
    "train target column missing": (
        (*TRAIN, "--target", "label"),
        "in.jsonl: row 0 has no target column 'label'; its columns: text, target. Name the "
        "target with --target COLUMN",
    ),
    # budgets: a value that is no number, a negative one, a cost nothing can price
    "budget not a number": (
        (*TRAIN, "--max-cost", "abc"),
        "Invalid value for '--max-cost': 'abc' is not a valid number; see 'plait train --help'",
    ),
    "budget not a whole number": (
        (*TRAIN, "--max-calls", "1.5"),
        "Invalid value for '--max-calls': '1.5' is not a valid whole number",
    ),
    "budget negative": ((*TRAIN, "--max-cost", "-1"), "-1.0 is not in the range x>=0"),
    "max cost without a price": (
        (*TRAIN, "--max-cost", "1"),
        "--max-cost needs the price of every endpoint, and '*' (the program's alias 'llm') has "
        'none; add price = {input = 0.15, output = 0.60} (dollars per million tokens) to ["*"] '
        "in res.toml, or budget with --max-calls / --max-tokens",
    ),
    "max cost without a price, estimated": (
        (*TRAIN, "--max-cost", "1", "--estimate"),
        "--max-cost needs the price of every endpoint",
    ),
    # eval takes the same budget, checked the same way
    "eval budget not a number": (
        (*EVAL, "--max-cost", "abc"),
        "Invalid value for '--max-cost': 'abc' is not a valid number; see 'plait eval --help'",
    ),
    "eval budget not a whole number": (
        (*EVAL, "--max-tokens", "1.5"),
        "Invalid value for '--max-tokens': '1.5' is not a valid whole number",
    ),
    "eval budget negative": ((*EVAL, "--max-calls", "-1"), "-1 is not in the range x>=0"),
    "eval max cost without a price": (
        (*EVAL, "--max-cost", "1"),
        "--max-cost needs the price of every endpoint, and '*' (the program's alias 'llm') has "
        'none; add price = {input = 0.15, output = 0.60} (dollars per million tokens) to ["*"] '
        "in res.toml, or budget with --max-calls / --max-tokens",
    ),
    "eval max cost without a price, estimated": (
        (*EVAL, "--max-cost", "1", "--estimate"),
        "--max-cost needs the price of every endpoint",
    ),
    # every whole-number and decimal option says so in words, not click's "range" types
    "max concurrent not a whole number": (
        (*RUN, "--max-concurrent", "abc"),
        "Invalid value for '--max-concurrent': 'abc' is not a valid whole number; "
        "see 'plait run --help'",
    ),
    "timeout not a number": (
        (*RUN, "--timeout", "soon"),
        "Invalid value for '--timeout': 'soon' is not a valid number; see 'plait run --help'",
    ),
    "train max concurrent not a whole number": (
        (*TRAIN, "--max-concurrent", "many"),
        "Invalid value for '--max-concurrent': 'many' is not a valid whole number",
    ),
    # estimates check what the run would
    "estimate metric unknown": (
        (*EVAL, "--estimate", "--metric", "nosuch"),
        "metric 'nosuch' is neither exact_match nor contains",
    ),
    "estimate target column missing": (
        (*EVAL, "--estimate", "--target", "label"),
        "in.jsonl: row 0 has no target column 'label'; its columns: text, target",
    ),
    "estimate input missing": (
        ("eval", "progs.py:Summarize", "-i", "none.jsonl", *RUN[4:], "--estimate"),
        "none.jsonl: no such file; check the path",
    ),
    "estimate sample not a number": (
        (*EVAL, "--estimate", "--sample", "x"),
        "'x' is not a valid whole number; see 'plait eval --help'",
    ),
    "train estimate resources missing": (
        (*TRAIN[:7], "missing.toml", *TRAIN[8:], "--estimate"),
        "--resources missing.toml: no such file",
    ),
    # graph and report
    "graph output folder missing": (
        ("graph", "progs.py:Summarize", "-o", "sub/g.md"),
        "--output sub/g.md: the folder sub does not exist",
    ),
    "graph input missing": (
        ("graph", "progs.py:Summarize", "-i", "none.jsonl"),
        "none.jsonl: no such file; check the path",
    ),
    "report not a run": (("report", "run.json", "-o", "r.html"), "run.json"),
    "report output folder missing": (
        ("report", "run.json", "-o", "sub/r.html"),
        "--output sub/r.html: the folder sub does not exist",
    ),
}


@pytest.mark.parametrize(("args", "message"), MISTAKES.values(), ids=MISTAKES.keys())
def test_a_mistake_is_one_line_saying_what_and_what_to_do_with_exit_2(
    workdir: Path, args: tuple[str, ...], message: str
) -> None:
    done = plait_cli(*args, cwd=workdir)

    assert done.code == 2, done.stderr
    assert done.stderr.startswith("plait: error: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr, done.stderr
    assert not (workdir / "out.jsonl").exists()
    assert not (workdir / "learned.json").exists()
