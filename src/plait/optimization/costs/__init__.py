"""Cost before it runs: calls, tokens and dollars an evaluation, a search or a Trainer will spend.

    estimate = await BootstrapFewShot(metric).estimate(program, trainset=train, valset=val)
    print(estimate)                # a table: each phase, low / expected / high
    estimate.calls.expected, estimate.cost.high
    estimate = plait.estimate(program, devset, resources=config)     # for evaluate
    estimate = trainer.estimate()

An estimate puts together three things:

* **the schedule** — how many times the work runs the program (examples ×
  candidates, bootstrap passes, minibatches, validations) and how many calls it
  makes outside the program (instruction proposals, parameter rewrites); each
  search says its own (`ProgramSearch._schedule`), from its settings and the
  data sizes;
* **the size of one run** — the calls one example makes and the tokens of each
  call, measured on a small sample: ``sample`` examples (2 by default) are run
  for real, and those calls are counted in `CostEstimate.sample_calls` (with
  the proposals below, the only calls an estimate makes; ``sample=0`` makes
  none, and then the calls per example come from the program's graph and the
  tokens from the text's length, with a wide reply range). What a demo adds to a prompt is
  measured too, when the schedule shows demos: the first sampled example runs
  once more with labeled demos (without a sample, it is counted from the
  training examples' length, about four characters a token);
* **proposals made for real** — where a search or the Trainer makes calls
  outside the program (RandomSearch's instruction proposals, ReflectiveSearch's
  rewrites, an optimizer's updates), the sample also makes one of them, on a
  copy of the program with feedback as long as a minibatch's, and (when it
  changed the value) a second on the value it gave (`sample_twice`: later
  proposals meet a rewritten value, which a model may propose again unchanged),
  and counts their calls with the sample's (`Proposal`): their prompt and reply
  tokens and their re-asks are then measured, not assumed. A model that writes
  long replies or whose proposals are refused and asked again shows it there;
  a search also plans the rest of its schedule by what the proposals gave (a
  refused rewrite ends its reflection early; a proposed instruction lengthens
  the prompts of the candidates that carry it; an update those of the runs
  after it). RandomSearch asks for the run's own first proposals instead (the
  seeds its schedule uses) and runs the sample once more under each instruction
  they gave (`measure_variant`): the candidates that carry an instruction are
  sized by the prompts and replies measured under it (`Phase.variants`), as
  its tokens (an odd text can take twice the usual tokens per character) and
  what it makes the model write do not show in its length. What the copies
  would warn of (a refused rewrite, a step that changed nothing) is logged at
  debug level (`quiet`): the run warns of its own. Without a sample, calls
  outside the program (and a judge's) are
  sized in characters by whoever makes them (an optimizer renders the prompts
  it would send: `Optimizer.estimated_calls`) and turned into tokens at the
  rate the sampled calls showed (characters of their messages per prompt
  token), in a range of half to twice the prompt and a quarter to twice the
  reply.

Dollars come from the price of each endpoint in the resource configuration (or
plait's table of list prices); an endpoint without a price makes the cost
unknown (None), which the table says.

The range: *low* assumes the fewest calls the schedule allows (candidates
identical to the program are skipped, no rewrite is needed) and the smallest
sampled calls; *high* the most (every re-ask, each carrying the replies it
refused, the largest sampled call); the token range of a call is at least
-20 % / +50 % around the sampled mean, as a
sample of a few examples cannot show more. The run's own budget, if set, caps
every column.

The folder: ``parts.py`` (`Range`, `Phase`, `Proposal`, `CostEstimate`), ``measure.py``
(one run measured on the sample), ``schedule.py`` (`from_schedule`, and `estimate` for
an evaluation).
"""

from plait.optimization.costs.measure import feedback_items as feedback_items
from plait.optimization.costs.measure import mean_call as mean_call
from plait.optimization.costs.measure import measure, measure_variant, quiet
from plait.optimization.costs.parts import CostEstimate, Phase, Proposal, Range, Variant
from plait.optimization.costs.parts import repeat_feedback as repeat_feedback
from plait.optimization.costs.parts import sample_twice as sample_twice
from plait.optimization.costs.schedule import check_sample, estimate, from_schedule

__all__ = [
    "CostEstimate",
    "Phase",
    "Proposal",
    "Range",
    "Variant",
    "check_sample",
    "estimate",
    "from_schedule",
    "measure",
    "measure_variant",
    "quiet",
]
