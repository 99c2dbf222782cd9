"""How well a product can serve a goal: the scorer's product-level parts and an option plan.

``product_fit`` evaluates once per (goal, product) what does not depend on the chosen
options: attribute matches, the price test, r_type, and for each goal option the
(option name, value) pairs of the product that would satisfy it. ``option_plan`` then finds
the fewest option clicks that make every goal option matched (an exact search over the
candidates, at most ``_MAX_CANDIDATES`` per goal option). A product is ``complete`` when it
can reach score 1.0: every attribute matched, price within the bound, r_type 1, and a plan.
The context (F) and the expert read these; the reward itself is goal_reward.score_purchase.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

from mcgpo.envs.webshop.catalogue import Goal, Product
from mcgpo.envs.webshop.goal_reward import (
    RULE_NOUNS,
    Nouns,
    TypeReward,
    attribute_matches,
    fuzzy_match,
    goal_option_keys,
    normalize_color,
    type_reward,
)

__all__ = ["ProductFit", "option_plan", "product_fit"]

_MAX_CANDIDATES = 8
Choice = tuple[str, str]  # (option name, value)


class ProductFit(NamedTuple):
    attributes: tuple[bool, ...]  # per goal attribute
    price_ok: bool
    type: TypeReward
    candidates: tuple[tuple[Choice, ...], ...]  # per goal option: the values that satisfy it
    plannable: bool  # some selection of values matches every goal option

    @property
    def product_level_ok(self) -> bool:
        return all(self.attributes) and self.price_ok and self.type.r_type == 1.0

    @property
    def complete(self) -> bool:
        return self.product_level_ok and self.plannable


def product_fit(product: Product, goal: Goal, nouns: Nouns = RULE_NOUNS) -> ProductFit:
    cands = []
    for ng in goal_option_keys(goal):
        cands.append(
            tuple(
                (name, v)
                for name, values in product.options
                for v in values
                if fuzzy_match(normalize_color(v), ng)
            )
        )
    fit = ProductFit(
        attribute_matches(product, goal),
        product.price <= goal.price_upper,
        type_reward(product, goal, nouns),
        tuple(cands),
        False,
    )
    return fit._replace(plannable=option_plan(fit, ()) is not None)


def option_plan(fit: ProductFit, chosen: Sequence[Choice]) -> tuple[Choice, ...] | None:
    """The clicks (in goal-option order) after which every goal option is matched.

    Minimises the number of clicks; a plan keeps one value per option name. Returns None
    when no selection satisfies all goal options, () when the current one already does.
    """
    if any(not c for c in fit.candidates):
        return None
    current = dict(chosen)
    best: tuple[Choice, ...] | None = None
    for combo in itertools.product(*(c[:_MAX_CANDIDATES] for c in fit.candidates)):
        picked: dict[str, str] = {}
        if any(picked.setdefault(name, value) != value for name, value in combo):
            continue  # two goal options would need two values of one option
        clicks = tuple((n, v) for n, v in picked.items() if current.get(n) != v)
        if best is None or len(clicks) < len(best):
            best = clicks
            if not clicks:
                break
    return best
