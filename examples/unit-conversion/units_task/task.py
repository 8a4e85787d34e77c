"""The same task as a class: its own instructions, a generator, and a scorer with options.

Registered in ``pyproject.toml`` as the entry point ``units`` (group ``llmrl.tasks``), so a
prepare config says ``task: units`` once the package is installed, or
``task: units_task.task:UnitsTask`` when it is only importable.
"""

from __future__ import annotations

import random

from llmrl.data.problem import Problem
from llmrl.envs.tasks import Score
from units_task.rewards import correct_value

FACTORS = {("km", "m"): 1000, ("m", "cm"): 100, ("kg", "g"): 1000, ("h", "min"): 60}


class UnitsTask:
    """Convert a quantity to another unit; answer ``Answer: <number> <unit>`` on the last line.

    ``max_quantity`` bounds the generated quantities; ``partial_credit`` is the reward of a
    well-formed wrong answer.
    """

    name = "units"
    instructions = (
        "Convert the quantity. Show the multiplication, then end with a last line "
        "'Answer: <number> <unit>'."
    )

    def __init__(self, max_quantity: int = 50, partial_credit: float = 0.1) -> None:
        if not 0 <= partial_credit < 1:
            raise ValueError(f"partial_credit must be in [0, 1), got {partial_credit}")
        self.max_quantity = max_quantity
        self.partial_credit = partial_credit

    def generate(self, count: int, seed: int, split: str) -> list[Problem]:
        """``count`` problems; train takes odd quantities, eval even ones (disjoint)."""
        rng = random.Random(f"{seed}-{split}")
        problems = []
        for index in range(count):
            (source, target), factor = rng.choice(sorted(FACTORS.items()))
            quantity = 2 * rng.randint(1, self.max_quantity) - (split == "train")
            problems.append(
                Problem(
                    id=f"units-{split}-{index}",
                    prompt=f"How many {target} are {quantity} {source}?",
                    answer=str(quantity * factor),
                    sft_target=f"{quantity} x {factor} = {quantity * factor}\n"
                    f"Answer: {quantity * factor} {target}",
                    fields={"to_unit": target, "kind": source},
                )
            )
        return problems

    def score(self, response: str, answer: str, to_unit: str) -> Score:
        """The reward of :func:`correct_value`, with this task's partial credit."""
        score = correct_value(response, answer, to_unit)
        if score.formatted and not score.correct:
            return Score(self.partial_credit, correct=False, parsed=score.parsed)
        return score

    def kind(self, problem: Problem) -> str | None:
        """The source unit: the evaluation reports accuracy per unit."""
        return problem.fields.get("kind")
