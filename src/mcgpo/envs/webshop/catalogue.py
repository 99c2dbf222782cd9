"""The catalogue: products, goals, the search index and the train / valid_seen / valid_unseen split.

A :class:`Catalogue` is immutable and shared by every environment built with the same
options (the generated one is cached in generator.py). It is built from records in the
schema of WebShop's own data files (schema.py parses them), whether they were generated or
loaded from disk.

Price rules (WebShop ``engine.py`` ``generate_product_prices`` and ``goal.py``):

* the price the reward compares is sampled once per product: the single listed price, or
  uniform between the two ends of a range, or 100.0 when no price is listed;
* a goal's bound: the first four multiples of 10 (10 ... 990) strictly above the target's
  price; when there are at least two, sample two and keep the larger; otherwise 10**6 and no
  price clause in the instruction. Our samples come from ``random.Random(seed)`` rather than
  WebShop's global ``random.seed(42)`` stream, so prices and bounds differ from WebShop's.

Splits. ``goals`` keep WebShop's order (products in file order, each product's
instructions in order); a split is a tuple of indices into it, played in that order.

* WebShop's own files (``scheme="webshop"``): WebShop shuffles its goal list once with
  ``random.seed(233)`` (``web_agent_text_env.py`` ``SimServer``) and its baselines
  (``baseline_models/env.py``, ``train_choice_il.py``) cut the shuffled list by index:
  ``test`` = positions 0-499 (the 500 goals the papers report), ``eval`` = 500-1499,
  ``train`` = 1500 to the end. ``random.Random(233).shuffle`` draws the same permutation,
  so the splits are WebShop's. Two more names: ``train_and_eval`` = 500 to the end (the
  training range of verl-agent's WebShop, the GiGPO recipe) and ``valid_seen`` = ``eval``
  (the name mcgpo's trainer evaluates on by default).
* The generated catalogue (``scheme="generated"``, a departure: it has no papers' split):
  the goals are shuffled with ``random.Random(seed)``. In each top-level category,
  ``unseen_fraction`` of the target product categories (leaf paths; rounded, at least one
  when there are two or more) are held out with a seeded shuffle: goals whose target lies
  there form ``valid_unseen`` and never appear in training. Of the remaining goals the first
  ``num_valid`` form ``valid_seen`` and the rest ``train``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mcgpo.envs.webshop.search import BM25Index

__all__ = [
    "PRICE_RANGE",
    "SCHEMES",
    "WEBSHOP_SPLITS",
    "Catalogue",
    "CatalogueError",
    "Goal",
    "Product",
    "price_upper",
    "sample_price",
]

PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
NO_PRICE_BOUND = 1_000_000.0
SCHEMES = ("webshop", "generated")
WEBSHOP_SHUFFLE_SEED = 233  # web_agent_text_env.py: random.seed(233); random.shuffle(goals)
# split name -> (first, end) positions in WebShop's shuffled goal list; end None = to the end
WEBSHOP_SPLITS: Mapping[str, tuple[int, int | None]] = {
    "test": (0, 500),
    "eval": (500, 1500),
    "train": (1500, None),
    "train_and_eval": (500, None),
    "valid_seen": (500, 1500),  # = eval
}


class CatalogueError(ValueError):
    """Catalogue data or options are unusable; the message names the file, record and field."""


@dataclass(frozen=True)
class Product:
    """One product page (WebShop's cleaned product dict)."""

    asin: str
    name: str  # WebShop `name` (shown as the title, `Title`)
    category: str  # top-level category, e.g. "fashion"
    query: str  # the query the product was collected with (lower-cased)
    product_category: str  # "A › B › C"
    description: str  # `full_description` (WebShop `Description`)
    bullets: tuple[str, ...]  # `small_description` (WebShop `BulletPoints`, the Features page)
    price_tag: str  # "$12.99" or "$9.98 to $16.98", as shown
    price: float  # the sampled price the reward compares with the bound
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (option name, values), page order
    attributes: tuple[str, ...]  # from items_ins_v2 `attributes` ("DUMMY_ATTR" when absent)


@dataclass(frozen=True)
class Goal:
    """One instruction with its target (WebShop's goal dict)."""

    asin: str  # the product the goal was written for (one that satisfies it)
    instruction: str  # the text shown to the agent, price clause included
    attributes: tuple[str, ...]  # `instruction_attributes`
    options: tuple[str, ...]  # `instruction_options` (option values)
    price_upper: float
    name: str  # the target's name (compared with the bought title for r_type)
    query: str
    category: str
    product_category: str
    # synthetic goals only: the option name of each value (WebShop keeps {name: value} and
    # scores the (name, value) pairs, goal_reward.goal_option_keys); () for human goals
    option_names: tuple[str, ...] = ()


def sample_price(pricing: Sequence[float], rng: random.Random) -> float:
    """The price the reward uses: the listed price, uniform over a range, or 100.0."""
    if not pricing:
        return 100.0
    if len(pricing) == 1:
        return float(pricing[0])
    return rng.uniform(pricing[0], pricing[1])


def price_upper(price: float, rng: random.Random) -> tuple[float, str]:
    """WebShop's synthetic bound and the clause appended to the instruction."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return NO_PRICE_BOUND, ""
    bound = max(rng.sample(above, 2))
    return bound, f", and price lower than {bound:.2f} dollars"


@dataclass(frozen=True, eq=False)
class Catalogue:
    """Products, goals, their split and the BM25 index over the products."""

    products: tuple[Product, ...]
    goals: tuple[Goal, ...]  # in WebShop's order (file order), not shuffled
    splits: Mapping[str, tuple[int, ...]]  # split name -> goal indices, in play order
    unseen_product_categories: frozenset[str]
    index: BM25Index
    by_asin: Mapping[str, int] = field(default_factory=dict)
    scheme: str = "generated"  # "webshop" (WebShop's fixed splits) or "generated"

    @classmethod
    def build(
        cls,
        products: Sequence[Product],
        goals: Sequence[Goal],
        *,
        seed: int,
        scheme: str = "generated",
        num_valid: int = 100,
        unseen_fraction: float = 0.2,
    ) -> Catalogue:
        """``scheme``: "webshop" cuts WebShop's split ranges; "generated" mcgpo's own split."""
        if scheme not in SCHEMES:
            raise CatalogueError(
                f"split scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}"
            )
        if not products:
            raise CatalogueError("catalogue: no products")
        if not goals:
            raise CatalogueError("catalogue: no goals (every instruction was skipped)")
        by_asin = {p.asin: i for i, p in enumerate(products)}
        for g in goals:
            if g.asin not in by_asin:
                raise CatalogueError(f"goal for asin {g.asin!r}: no such product")
        unseen: frozenset[str] = frozenset()
        if scheme == "webshop":
            splits = _webshop_splits(len(goals))
        else:
            splits, unseen = _generated_splits(goals, seed, num_valid, unseen_fraction)
        documents = [_document(p) for p in products]
        return cls(
            tuple(products), tuple(goals), splits, unseen, BM25Index(documents), by_asin, scheme
        )

    def goal(self, split: str, seed: int) -> Goal:
        """The goal of (split, seed): the split's goals in order, seed taken modulo its size."""
        if split not in self.splits:
            known = ", ".join(self.splits)
            if self.scheme == "webshop":
                hint = "WebShop's own files; valid_seen = eval"
            else:
                hint = "the generated catalogue; 'test' and 'eval' exist only for WebShop's files"
            raise CatalogueError(f"unknown split {split!r}; known: {known} ({hint})")
        ids = self.splits[split]
        if not ids:
            raise CatalogueError(f"split {split!r} has no goals: {self._split_rule(split)}")
        return self.goals[ids[seed % len(ids)]]

    def product(self, asin: str) -> Product:
        return self.products[self.by_asin[asin]]

    def search(self, query: str, k: int) -> tuple[int, ...]:
        """Product indices of the top ``k`` BM25 hits of ``query`` (best first)."""
        return self.index.search(query, k)

    def _split_rule(self, split: str) -> str:
        n = len(self.goals)
        if self.scheme == "webshop":
            first, end = WEBSHOP_SPLITS[split]
            span = f"{first}-{end - 1}" if end is not None else f"{first} to the end"
            return f"it is WebShop's shuffled goals {span} and this catalogue has {n} goals"
        sizes = ", ".join(f"{k} {len(v)}" for k, v in self.splits.items())
        return f"the generated catalogue's {n} goals split as {sizes}"


def _webshop_splits(n: int) -> dict[str, tuple[int, ...]]:
    """WebShop's fixed ranges over its seed-233 shuffle of the goal list."""
    order = list(range(n))
    random.Random(WEBSHOP_SHUFFLE_SEED).shuffle(order)
    return {name: tuple(order[first:end]) for name, (first, end) in WEBSHOP_SPLITS.items()}


def _generated_splits(
    goals: Sequence[Goal], seed: int, num_valid: int, unseen_fraction: float
) -> tuple[dict[str, tuple[int, ...]], frozenset[str]]:
    """mcgpo's split of the generated catalogue (module docstring)."""
    if isinstance(num_valid, bool) or not isinstance(num_valid, int) or num_valid < 0:
        raise CatalogueError(f"num_valid must be an integer >= 0, got {num_valid!r}")
    if not 0.0 <= unseen_fraction < 1.0:
        raise CatalogueError(f"unseen_fraction must be in [0, 1), got {unseen_fraction}")
    order = list(range(len(goals)))
    random.Random(seed).shuffle(order)
    unseen = _held_out_categories([goals[i] for i in order], seed, unseen_fraction)
    seen = [i for i in order if goals[i].product_category not in unseen]
    splits = {
        "train": tuple(seen[num_valid:]),
        "valid_seen": tuple(seen[:num_valid]),
        "valid_unseen": tuple(i for i in order if goals[i].product_category in unseen),
    }
    return splits, unseen


def _document(p: Product) -> str:
    """What the index sees: title, features, description and option values."""
    values = " ".join(v for _, vs in p.options for v in vs)
    return " ".join((p.name, " ".join(p.bullets), p.description, values))


def _held_out_categories(goals: Sequence[Goal], seed: int, fraction: float) -> frozenset[str]:
    by_top: dict[str, set[str]] = {}
    for g in goals:
        by_top.setdefault(g.category, set()).add(g.product_category)
    held: set[str] = set()
    for top in sorted(by_top):
        paths = sorted(by_top[top])
        n = len(paths)
        k = min(n - 1, max(1, math.floor(fraction * n + 0.5))) if fraction > 0 and n > 1 else 0
        random.Random(f"{seed}:{top}").shuffle(paths)
        held.update(paths[:k])
    return frozenset(held)
