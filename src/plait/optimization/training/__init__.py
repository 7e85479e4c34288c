"""Feedback learning: losses judge outputs, backward routes their feedback, optimizers rewrite.

    step = TrainingStep(program, VerifierLoss(exact_match))     # a program and its loss
    loss = await step(question, answer)                          # in training mode
    await loss.backward()                                        # feedback per parameter
    report = await SFAOptimizer(program.named_parameters()).bind(config).step()
    report = await Trainer(program, loss_fn, optimizer, ...).fit()   # epochs of that

The folder, one file per part:

* ``losses.py`` — `Loss`, `VerifierLoss`, `HumanFeedbackLoss`, `CompositeLoss`; ``judges.py``
  the LLM losses (`LLMJudge`, `LLMRubricLoss`, `LLMPreferenceLoss`, `LLMRankingLoss`);
* ``step.py`` — `TrainingStep`: a program and its loss traced as one graph;
* ``backward.py`` — `backward`: feedback from a loss to every learnable parameter, through tapes;
* ``optimizer.py`` — `Optimizer`, the base: which parameters, in what order, what is
  applied, reverted and recorded; ``prompts.py`` what it shows the model; ``updates.py``
  what a usable update is (`check_update`);
* one file per optimizer: ``sfa.py`` (`SFAOptimizer`), ``textgrad.py`` (`TextGradOptimizer`);
* ``trainer.py`` — `Trainer`: epochs, validation, keep-best; ``report.py`` its
  `TrainReport`; ``trainer_checkpoint.py`` and ``trainer_estimate.py`` its checkpoint and
  cost estimate (``trainer_parts.py`` what those use of it, for the type checker).

To add an optimizer: subclass `Optimizer` in a file of its own and implement `_propose`
(ask through `_ask_for_value`, so every proposal is a structured call checked by
`check_update`) and, when its calls are not one `_value_prompt`, `estimated_calls`. To add
a loss: a `Loss` subclass whose ``forward(output, target)`` returns a `Feedback`.
"""
