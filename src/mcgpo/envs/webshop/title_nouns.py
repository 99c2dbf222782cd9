"""The title nouns behind WebShop's r_type: spaCy's NOUN/PROPN tags, or a rule-based fallback.

WebShop (``web_agent_site/engine/goal.py`` ``get_type_reward``) runs a spaCy English pipeline
on the bought product's name and the goal's target name and keeps, in order and with
repeats, the lower-cased text of every token tagged NOUN or PROPN (its code also lists the
non-existent tag "PNOUN", which never occurs). WebShop's current code loads
``en_core_web_sm``; the code of the paper's release loaded ``en_core_web_lg``.

Two taggers, chosen by ``noun_tagger(kind, model)``:

* :class:`SpacyNouns`: WebShop's rule exactly, with a spaCy pipeline loaded by name
  (``en_core_web_sm``, an installed package) or by path (a pipeline folder) from the user's
  environment. Nothing is ever downloaded: a missing model is a one-line error.
* :class:`RuleNouns`: no spaCy. On Title Case product names spaCy's English pipelines tag
  nearly every word PROPN or NOUN (colour, size and material words included: "Dark",
  "Roast", "Queen", "Wood"), so the fallback keeps every word except numbers and the closed
  English word classes (determiners, prepositions, conjunctions, pronouns, auxiliaries,
  particles), and lower-case adjectives of a short list. It cannot see context (spaCy tags
  "Trailpeak" VERB in "Trailpeak Waterproof Hiking Boots", a guess from the word's shape):
  its agreement with en_core_web_sm is measured in docs/envs/webshop.md §3
  (benchmarks/bench_webshop_nouns.py).

``kind``: ``"spacy"`` (the model must load), ``"rules"``, or ``"auto"`` (spaCy when it and the
model load, else the rules; the caller logs which). Taggers are cached per (kind, model) in
the process, so every environment of a pool shares one loaded pipeline.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any, Protocol

__all__ = [
    "NOUN_TAGGERS",
    "NOUN_TAGS",
    "NounTagger",
    "NounTaggerError",
    "RuleNouns",
    "SpacyNouns",
    "noun_tagger",
    "rule_nouns",
]

logger = logging.getLogger(__name__)

NOUN_TAGS = frozenset({"PNOUN", "NOUN", "PROPN"})  # WebShop's tuple, "PNOUN" included
NOUN_TAGGERS = ("auto", "spacy", "rules")
_CACHE = 1 << 16


class NounTaggerError(ValueError):
    """The requested tagger cannot be built (spaCy or its model missing, unknown kind)."""


class NounTagger(Protocol):
    name: str  # what r_type uses, e.g. "spacy:en_core_web_sm" or "rules"

    def __call__(self, title: str) -> tuple[str, ...]: ...


# Closed word classes of English (spaCy's DET, ADP, CCONJ, SCONJ, PRON, AUX, PART), and the
# "x" of dimensions (SYM): never NOUN/PROPN in a product name, whatever their case.


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


_CLOSED = _word_set(
    """
    a an the this that these those my your our their its his her some any each every no
    for of with without in on at by from to into onto upon via per than as like
    and or nor but yet if because while although
    i you he she it we they me him us them is are was were be been being am
    has have had do does did will would can could shall should may might must not
    up s x
    """
)
# Adjectives spaCy tags ADJ when a title writes them in lower case (in Title Case it tags
# them PROPN like the other words, and so does the fallback).
_LOWER_ADJECTIVES = _word_set(
    """
    new extra super ultra mini large small big long short high low soft hard heavy light
    easy quick fast slow natural organic free waterproof portable adjustable wireless
    compatible durable premium professional stainless non
    """
)
# Tokens roughly as spaCy's English tokenizer cuts product names: dotted abbreviations
# ("d.o.n.") and decimals ("3.1") stay whole; other punctuation separates ("T-Shirt" -> "T",
# "Shirt"; "Men's" -> "Men", "s").
_TOKEN = re.compile(r"[A-Za-z0-9]+(?:\.[A-Za-z0-9]+)+\.?|[A-Za-z0-9]+")
_NUMBER = re.compile(r"[0-9][0-9.,]*")
# spaCy's tokenizer cuts a unit off a number ("4K" -> "4", "K"; "16oz" -> "16", "oz"); its
# unit list, the entries that occur in product names (case-sensitive, as spaCy's)
_UNITS = "|".join(
    sorted(
        _word_set("km m dm cm mm yd in ft kg g mg lb lbs oz mph mb MB kb KB gb GB tb TB T G M K"),
        key=len,
        reverse=True,
    )
)
_NUMBER_UNIT = re.compile(rf"([0-9]+(?:\.[0-9]+)?)({_UNITS})")


def _tokens(title: str) -> list[str]:
    out = []
    for token in _TOKEN.findall(title):
        m = _NUMBER_UNIT.fullmatch(token)
        out.extend(m.groups() if m else (token,))
    return out


def rule_nouns(title: str) -> tuple[str, ...]:
    """The fallback's nouns of ``title``: lower-cased, in order, repeats kept."""
    out = []
    for token in _tokens(title):
        low = token.lower()
        if low in _CLOSED or _NUMBER.fullmatch(low):
            continue
        if token == low and low in _LOWER_ADJECTIVES:
            continue
        out.append(low)
    return tuple(out)


class RuleNouns:
    """The rule-based fallback (no spaCy)."""

    name = "rules"

    def __call__(self, title: str) -> tuple[str, ...]:
        return _cached_rule_nouns(title)


@lru_cache(maxsize=_CACHE)
def _cached_rule_nouns(title: str) -> tuple[str, ...]:
    return rule_nouns(title)


class SpacyNouns:
    """WebShop's rule with a spaCy pipeline: tokens tagged NOUN or PROPN, lower-cased."""

    def __init__(self, model: str | Any) -> None:
        """``model``: a pipeline name or folder to ``spacy.load``, or a loaded ``Language``."""
        if isinstance(model, str):
            self._nlp = _load_spacy(model)
            self.name = f"spacy:{model}"
        else:
            self._nlp = model
            self.name = f"spacy:{model.meta.get('name', 'pipeline')}"
        self._cache: dict[str, tuple[str, ...]] = {}

    def __call__(self, title: str) -> tuple[str, ...]:
        hit = self._cache.get(title)
        if hit is None:
            doc = self._nlp(title)
            hit = tuple(t.text.lower() for t in doc if t.pos_ in NOUN_TAGS)
            if len(self._cache) >= _CACHE:
                self._cache.clear()
            self._cache[title] = hit
        return hit


def _load_spacy(model: str) -> Any:
    try:
        import spacy
    except ImportError:
        raise NounTaggerError(
            "spaCy is not installed (pip install 'mcgpo[webshop]'), needed for noun_tagger='spacy'"
        ) from None
    try:
        return spacy.load(model)
    except Exception as err:  # not found, wrong spaCy version, broken folder: one line each
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise NounTaggerError(
            f"spaCy model {model!r} does not load (install it, e.g. `python -m spacy download "
            f"{model}`, or give a pipeline folder): {first}"
        ) from None


@lru_cache(maxsize=8)
def noun_tagger(kind: str = "auto", model: str = "en_core_web_sm") -> NounTagger:
    """The tagger for ``kind`` (auto / spacy / rules), cached; "auto" falls back to the rules."""
    if kind not in NOUN_TAGGERS:
        raise NounTaggerError(f"noun_tagger must be one of {', '.join(NOUN_TAGGERS)}, got {kind!r}")
    if kind == "rules":
        return RuleNouns()
    if not isinstance(model, str) or not model:
        raise NounTaggerError(f"spacy_model must be a model name or folder, got {model!r}")
    if kind == "spacy":
        return SpacyNouns(model)
    try:
        return SpacyNouns(model)
    except NounTaggerError as err:
        logger.warning("WebShop r_type: %s; using the rule-based noun fallback", err)
        return RuleNouns()
