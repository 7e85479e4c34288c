"""Program search: optimizers that try whole candidate programs and keep the best on validation.

Where `SFAOptimizer` and `TextGradOptimizer` rewrite parameters step by step
from feedback, these optimizers build *candidate programs* (deep copies with
other demos, instructions or settings), evaluate every candidate on a
validation set, and apply the best one to the program:

    report = await BootstrapFewShot(metric).compile(program, trainset=train, valset=val)
    print(report.table())                      # the trials, best first (rows(): dicts)
    report.improved, report.reason             # what was kept, and why, in words
    program.state.best_params, program.is_compiled()

One calling convention for every search: the constructor takes the metric
first, then the search's own options; ``compile(program, trainset=...,
valset=...)`` (``train_set=`` / ``val_set=`` work too) returns
a `SearchReport`. Like a module call, ``compile`` is awaited inside a running
event loop and runs to completion in a script with no loop running.

Shared here (`ProgramSearch`), so every such optimizer behaves alike:

* candidates are evaluated **concurrently**, all through one resource manager,
  so the endpoints' limits hold across the whole search;
* the program as it was is always trial 0 (a candidate identical to it is not
  evaluated again), and a candidate is chosen only if
  its validation score is at least trial 0's (a search never ends below its
  start on validation) and, by default, only if it beats trial 0 on clearly
  more validation examples than it loses (a one-sided sign test at
  ``significance`` 0.1). Why: on 30 validation examples, candidates that
  differ only by noise differ by several examples. Measured on SmolLM2-135M,
  BBH boolean_expressions: 17 random balanced demo sets scored 0.33 to 0.77
  on validation, and their validation score did not predict their test score
  (the 0.77 ones scored 0.56 to 0.59 on test, the zero-shot program 0.64);
* among those, the choice is by a *balanced* score when the targets are
  labels (the mean over target values of each value's mean score), then by
  the plain score, then the earlier trial. Why: on 30 validation items a
  candidate that always answers the majority label scores the majority share
  (0.70 on BBH boolean_expressions' validation split, 0.52 on its test split);
  balanced, it scores 0.5 and does not win;
* the report says why the program was kept or changed, from the evidence:
  the labels the program predicts, wins and losses against trial 0 example by
  example, the sign test (`SearchReport.reason`, also logged);
* every trial is recorded in ``program.state`` (`ModuleState`): trials, best score,
  best parameters; ``is_compiled()`` once a search has changed the program;
* the calls the search made are counted (`SearchReport.calls`).

The folder, one file per part:

* ``base.py`` — `ProgramSearch`, and `SearchOverrides`: the points a search overrides;
* ``report.py`` — `Trial`, `SearchReport`, the choice and the reason (`explain`);
* ``checkpoint.py`` — the checkpoint file every search takes (``checkpoint=``), and
  ``resume.py`` the search's side of it: what it resumes from and writes;
* ``estimate.py`` — ``search.estimate(...)``: what `compile` would spend;
* one file per search: ``grid.py`` (`GridSearch`, `optimize_grid`), ``labeled.py``
  (`LabeledFewShot`), ``bootstrap.py`` (`BootstrapFewShot`), ``random_search.py``
  (`RandomSearch`), ``reflective.py`` (`ReflectiveSearch`); ``demos.py`` holds what the
  demo searches share (demo sets balanced across labels, the bootstrap pass).

To add a search: subclass `ProgramSearch` in a file of its own and implement what
`SearchOverrides` lists for it; evaluation, selection, the never-below-start guard,
metering, the hard budget, the checkpoint of its trials and ``program.state`` come with it.
"""

from plait.optimization.search.base import Candidate as Candidate
from plait.optimization.search.base import ProgramSearch
from plait.optimization.search.base import SearchOverrides as SearchOverrides
from plait.optimization.search.grid import GridSearch, optimize_grid
from plait.optimization.search.report import SearchReport, Trial, balanced_score, sign_test

__all__ = [
    "GridSearch",
    "ProgramSearch",
    "SearchReport",
    "Trial",
    "balanced_score",
    "optimize_grid",
    "sign_test",
]
