"""WebShop's task score at Buy Now (``web_agent_site/engine/goal.py`` ``get_reward``).

    score = r_type * (N_attr + N_opt + [price <= price_upper]) / (|attributes| + |options| + 1)

* N_attr: goal attributes g matched by the bought product: some product attribute p with
  token_set_ratio(p, g) > 85, else g a substring of the lower-cased title, features
  (bullet points) or description.
* N_opt: goal options g matched by some chosen option value p with token_set_ratio > 85,
  both colour-normalised first (``normalize_color``: the first COLOR_SET word contained in
  the string, else the string). One chosen value may match several goal options. Synthetic
  goals (WebShop's items_ins_v2 goals, a {name: value} dict) are compared as WebShop does:
  its get_reward passes ``dict.items()``, so each goal option is the pair (name, value);
  ``normalize_color`` on a pair tests tuple membership (a colour word equal to the name or
  the value), and thefuzz turns a pair that stays a pair into ``str(pair)`` before its string
  processing (``goal_option_keys``).
* r_type from query_match (same collection query), category_match (the product-category
  paths share >= 2 levels) and title_score = |nouns(bought) ∩ nouns(goal)| / len(nouns(goal))
  (0.2 when the goal name has no nouns): r_type = 1 if any match or title_score > 0.2,
  else 0.5; then 0.1 if title_score < 0.1; then 0 if title_score == 0. The nouns are spaCy's
  NOUN/PROPN tokens or the rule-based fallback (title_nouns.py); as in WebShop they are a
  list: the denominator counts repeats, the overlap does not.
* success: score == 1.0 exactly.

Departure: token_set_ratio is computed as thefuzz >= 0.20 does it, on rapidfuzz (WebShop
pins thefuzz 0.19, whose ratio is python-Levenshtein's, the same Indel ratio): strings
lose the characters 128-255, are lower-cased with every non-alphanumeric character turned
into a space (rapidfuzz ``default_process``), and the score is rounded to an integer before
the "> 85" test (thefuzz returns int(round(score))), so 85.4 fails and 85.6 passes, as in
WebShop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import NamedTuple

from rapidfuzz.fuzz import token_set_ratio
from rapidfuzz.utils import default_process

from mcgpo.envs.webshop.catalogue import Goal, Product
from mcgpo.envs.webshop.title_nouns import RuleNouns
from mcgpo.envs.webshop.words import COLOR_SET

__all__ = [
    "MATCH_THRESHOLD",
    "Score",
    "TypeReward",
    "attribute_matches",
    "fuzzy_match",
    "goal_option_keys",
    "key_matches",
    "normalize_color",
    "option_matches",
    "score_purchase",
    "score_value",
    "type_reward",
]

MATCH_THRESHOLD = 85  # a match needs int(round(token_set_ratio)) > 85
_LATIN1 = {i: None for i in range(128, 256)}
Nouns = Callable[[str], tuple[str, ...]]  # title -> its nouns (title_nouns.py)
RULE_NOUNS: Nouns = RuleNouns()  # the default tagger: the rule fallback, cached


class TypeReward(NamedTuple):
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float


class Score(NamedTuple):
    """The scorer's structured information about one (product, chosen options) pair."""

    attributes: tuple[bool, ...]  # per goal attribute: matched
    options: tuple[bool, ...]  # per goal option: matched by a chosen value
    price_ok: bool  # price <= price_upper
    type: TypeReward
    score: float  # the reward Buy Now gives


@lru_cache(maxsize=1 << 16)
def fuzzy_match(a: str, b: str) -> bool:
    """thefuzz ``token_set_ratio(a, b) > 85`` (see departure 1)."""
    pa = default_process(a.translate(_LATIN1))
    pb = default_process(b.translate(_LATIN1))
    return round(token_set_ratio(pa, pb)) > MATCH_THRESHOLD


@lru_cache(maxsize=1 << 14)
def normalize_color(value: str) -> str:
    """The first WebShop colour word contained in ``value`` (substring), else ``value``."""
    for colour in COLOR_SET:
        if colour in value:
            return colour
    return value


def goal_option_keys(goal: Goal) -> tuple[str, ...]:
    """Each goal option as the scorer compares it (module docstring, N_opt)."""
    if not goal.option_names:
        return tuple(normalize_color(g) for g in goal.options)
    return tuple(_pair_key(n, v) for n, v in zip(goal.option_names, goal.options, strict=True))


@lru_cache(maxsize=1 << 14)
def _pair_key(name: str, value: str) -> str:
    """WebShop's normalize_color on a (name, value) pair, then thefuzz's str() of it."""
    pair = (name, value)
    for colour in COLOR_SET:
        if colour in pair:  # tuple membership: equal to the name or the value
            return colour
    return str(pair)


def type_reward(product: Product, goal: Goal, nouns: Nouns = RULE_NOUNS) -> TypeReward:
    """r_type from query, category and title-noun overlap (WebShop ``get_type_reward``).

    ``nouns``: the title-noun tagger (title_nouns.py; the env passes the one it chose).
    """
    query_match = product.query == goal.query
    bought = {x.strip() for x in product.product_category.split("›")}
    wanted = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(bought & wanted) >= 2
    desired = nouns(goal.name)
    if desired:
        title_score = len(set(nouns(product.name)) & set(desired)) / len(desired)
    else:
        title_score = 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return TypeReward(r_type, query_match, category_match, title_score)


def attribute_matches(product: Product, goal: Goal) -> tuple[bool, ...]:
    """Per goal attribute: fuzzy-matched by a product attribute, or found in the page text."""
    title = product.name.lower()
    bullets = " ".join(product.bullets).lower()
    description = product.description.lower()
    out = []
    for g in goal.attributes:
        hit = any(fuzzy_match(p, g) for p in product.attributes)
        out.append(hit or g in title or g in bullets or g in description)
    return tuple(out)


def option_matches(chosen: Iterable[str], goal_options: Sequence[str]) -> tuple[bool, ...]:
    """Per goal option value: some chosen value matches it after colour normalisation."""
    return key_matches(chosen, tuple(normalize_color(g) for g in goal_options))


def key_matches(chosen: Iterable[str], keys: Sequence[str]) -> tuple[bool, ...]:
    """Per goal option key (``goal_option_keys``): some colour-normalised chosen value matches."""
    values = [normalize_color(v) for v in chosen]
    return tuple(any(fuzzy_match(v, k) for v in values) for k in keys)


def score_value(
    r_type: float, attrs: Sequence[bool], opts: Sequence[bool], price_ok: bool
) -> float:
    """Eq. of the module docstring: r_type * matched / (|attributes| + |options| + 1)."""
    matched = sum(attrs) + sum(opts) + int(price_ok)
    return r_type * matched / (len(attrs) + len(opts) + 1)


def score_purchase(
    product: Product, goal: Goal, chosen: Iterable[str], nouns: Nouns = RULE_NOUNS
) -> Score:
    """Everything the scorer knows about buying ``product`` with option values ``chosen``."""
    attrs = attribute_matches(product, goal)
    opts = key_matches(chosen, goal_option_keys(goal))
    price_ok = product.price <= goal.price_upper
    rtype = type_reward(product, goal, nouns)
    return Score(attrs, opts, price_ok, rtype, score_value(rtype.r_type, attrs, opts, price_ok))
