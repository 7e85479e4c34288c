"""The learning entry points called from a plain script: no event loop, no ``await``.

Issue 21.7: a module call runs to completion in a script, but ``evaluate``
returned a coroutine there that nothing could ever run. Every public entry
point follows the module call's rule: with no event loop running it runs to
completion and returns the result; inside one it returns an awaitable.

The script runs in a real subprocess against the scripted server, which this
test's event loop serves while the script blocks in its own process.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import plait
from plait import Predict, ResourceConfig, evaluate, run_dataset
from plait.optimization import LabeledFewShot
from plait.signatures import PlainAdapter
from plait.testing import ScriptedServer

from .test_search import PARITY, TRAIN, VAL, balanced_demos, model

SCRIPT = textwrap.dedent(
    """
    import json, sys

    from plait import Predict, ResourceConfig, SFAOptimizer, evaluate, run_dataset
    from plait.optimization import LabeledFewShot, Trainer, optimize_grid
    from plait.signatures import PlainAdapter

    endpoint, train, val = json.loads(sys.argv[1])
    config = ResourceConfig({"*": endpoint})
    program = Predict("number -> parity: Literal['even', 'odd']", adapter=PlainAdapter())
    seen = {}

    result = evaluate(program, val, resources=config)
    seen["evaluate"] = [type(result).__name__, float(result)]
    outputs = run_dataset(program, [x for x, _ in val], resources=config)
    seen["run_dataset"] = [type(outputs).__name__, len(outputs.outputs)]
    report = LabeledFewShot(k=4).compile(program, trainset=train, valset=val, resources=config)
    seen["compile"] = [type(report).__name__, report.improved, program.is_compiled()]
    grid = program.optimize_grid(val, None, {"temperature": [0.0]}, resources=config)
    seen["Module.optimize_grid"] = type(grid).__name__
    grid = optimize_grid(program, val, None, {"temperature": [0.5]}, resources=config)
    seen["optimize_grid"] = type(grid).__name__
    trainer = Trainer(
        program,
        lambda output, target: output.parity == target,
        SFAOptimizer(program.named_parameters(), max_retries=0),
        resources=config,
        train_set=train[:2],
        val_set=val[:2],
        batch_size=2,
        progress=False,
    )
    seen["Trainer.fit"] = type(trainer.fit()).__name__
    print("RESULT " + json.dumps(seen))
    """
)


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(responder=model(balanced_demos)) as running:
        yield running


async def test_entry_points_run_to_completion_from_a_script(
    server: ScriptedServer, tmp_path: Path
) -> None:
    script = tmp_path / "learn.py"
    script.write_text(SCRIPT, encoding="utf-8")
    source = str(Path(plait.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}
    argument = json.dumps([server.endpoint(max_retries=0), TRAIN, VAL])
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        argument,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr.decode()[-2000:]
    assert "was never awaited" not in stderr.decode()
    seen = json.loads(stdout.decode().split("RESULT ")[-1])
    assert seen == {
        "evaluate": ["EvaluationResult", 0.5],
        "run_dataset": ["RunResult", len(VAL)],
        "compile": ["SearchReport", True, True],
        "Module.optimize_grid": "SearchReport",
        "optimize_grid": "SearchReport",
        "Trainer.fit": "TrainReport",
    }


async def test_inside_a_running_loop_the_entry_points_are_awaitable(
    server: ScriptedServer,
) -> None:
    config = ResourceConfig({"*": server.endpoint(max_retries=0)})
    program = Predict(PARITY, adapter=PlainAdapter())
    pending = [
        evaluate(program, VAL, resources=config),
        run_dataset(program, [x for x, _ in VAL], resources=config),
        LabeledFewShot(k=4).compile(program.copy(), TRAIN, VAL, resources=config),
        program.copy().optimize_grid(VAL, None, {"temperature": [0.0]}, resources=config),
    ]
    assert all(inspect.isawaitable(work) for work in pending)
    done = await asyncio.gather(*pending)
    assert float(done[0]) == 0.5 and done[2].improved
