"""WebShopEnv: WebShop's text protocol on a generated (or WebShop's own) catalogue.

Actions are ``search[<query>]`` (only where the page has the search bar: the start page)
and ``click[<button>]`` for any button the page lists; an episode ends at "Buy Now" or after
``max_turns`` turns (15 by default, the WebShop horizon of the MCGPO / GiGPO recipes).

Reward (the training signal; verl-agent ``WebshopWorker.step``): 10.0 at the Buy Now turn
when WebShop's task score equals 1.0 exactly (``won``), otherwise 0.0 on every turn. The
raw task score (goal_reward.py, in [0, 1]) is in ``info["score"]`` at Buy Now (0.0 on
earlier turns and when the turn limit ends the episode); nothing rescales it elsewhere.

r_type's title nouns (goal_reward.py, title_nouns.py) come from spaCy or from the rule
fallback: option ``noun_tagger`` ("auto" by default: spaCy's ``spacy_model`` on WebShop's
own files when spaCy and the model load, else the rules; the rules on the generated
catalogue, so its numbers do not depend on what is installed), "spacy" or "rules". The
choice is logged once per process (logger ``mcgpo.envs.webshop.env``) and is
``env.noun_tagger_name``.

Splits: WebShop's own (``test``, ``eval``, ``train``, ``train_and_eval``, ``valid_seen`` =
``eval``) on WebShop's files, mcgpo's ``train`` / ``valid_seen`` / ``valid_unseen`` on the
generated catalogue (catalogue.py); ``num_valid`` and ``unseen_fraction`` apply to the
generated catalogue only.

``info`` keys: ``won``, ``score``, ``action_valid``, ``turn``, ``page`` (page kind),
``truncated`` (ended by the turn limit), ``preview`` (the score Buy Now would give now,
the context's progress_value), ``invalid_reason`` ("" when valid), and at Buy Now
``purchase`` (asin, chosen options and the scorer's breakdown).

Bad input never raises: text that is not ``search[...]`` / ``click[...]``, longer than
``max_action_chars``, a search off the start page, a search that is empty or not printable
ASCII, or a click on text the page does not list leaves the page unchanged, is marked
``action_valid=False`` and costs a turn. ``admissible_actions`` lists ``search[<your
query>]`` (verl-agent's placeholder: the agent writes its own query) when the search bar is
there, then ``click[<button>]`` for every button in page order.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from mcgpo.envs.protocol import Context, Observation, StepResult, unknown_option
from mcgpo.envs.webshop.catalogue import Catalogue, CatalogueError, Goal
from mcgpo.envs.webshop.context import page_context
from mcgpo.envs.webshop.expert import expert_action
from mcgpo.envs.webshop.generator import generated_catalogue
from mcgpo.envs.webshop.goal_reward import score_purchase
from mcgpo.envs.webshop.pages import Page, View, click, render, search
from mcgpo.envs.webshop.product_fit import ProductFit, product_fit
from mcgpo.envs.webshop.schema import load_catalogue
from mcgpo.envs.webshop.title_nouns import NounTagger, NounTaggerError, noun_tagger

__all__ = ["SEARCH_PLACEHOLDER", "SUCCESS_REWARD", "WebShopEnv"]

SUCCESS_REWARD = 10.0
SEARCH_PLACEHOLDER = "search[<your query>]"
_ACTION = re.compile(r"\s*(search|click)\[(.*)\]\s*", re.IGNORECASE | re.DOTALL)
logger = logging.getLogger(__name__)
_ANNOUNCED: set[tuple[str, str]] = set()  # (data, tagger) pairs already logged


class WebShopEnv:
    """One WebShop session at a time. ``reset(seed, split)`` picks goal ``seed`` of the split."""

    def __init__(
        self,
        *,
        max_turns: int = 15,
        num_products: int = 1000,
        catalogue_seed: int = 0,
        goals_per_product: int = 2,
        num_valid: int | None = None,
        unseen_fraction: float | None = None,
        products_path: str | None = None,
        attributes_path: str | None = None,
        goals_path: str | None = None,
        results_per_page: int = 10,
        top_n: int = 50,
        max_action_chars: int = 1000,
        noun_tagger: str = "auto",
        spacy_model: str = "en_core_web_sm",
        **unknown: Any,
    ) -> None:
        if unknown:
            raise CatalogueError(unknown_option("webshop", unknown, WebShopEnv))
        for name, value in (
            ("max_turns", max_turns),
            ("num_products", num_products),
            ("goals_per_product", goals_per_product),
            ("results_per_page", results_per_page),
            ("top_n", top_n),
            ("max_action_chars", max_action_chars),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CatalogueError(f"WebShopEnv: {name} must be an integer >= 1, got {value!r}")
        if products_path is None and (attributes_path or goals_path):
            raise CatalogueError("WebShopEnv: attributes_path / goals_path need products_path")
        if products_path is not None and (num_valid is not None or unseen_fraction is not None):
            raise CatalogueError(
                "WebShopEnv: num_valid / unseen_fraction split the generated catalogue only; "
                "WebShop's files use WebShop's splits (test, eval, train)"
            )
        self._source = (
            (num_products, catalogue_seed, goals_per_product, num_valid, unseen_fraction),
            (products_path, attributes_path, goals_path),
        )
        self._tagger_options = (noun_tagger, spacy_model, products_path is not None)
        self.catalogue: Catalogue = _catalogue(self._source)
        self._nouns: NounTagger = _tagger(*self._tagger_options)
        self.max_turns = max_turns
        self.per_page, self.top_n, self.max_action_chars = results_per_page, top_n, max_action_chars
        self._goal: Goal | None = None
        self._page = Page("search")
        self._view = View("", (), False, ())
        self._obs: Observation | None = None
        self._fits: dict[int, ProductFit] = {}
        self._turn = 0
        self._done = True

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int = 0, split: str = "train") -> Observation:
        """Goal ``seed`` (modulo its size) of ``split``; the splits are the catalogue's."""
        self._goal = self.catalogue.goal(split, int(seed))
        self._fits = {}
        self._turn, self._done = 0, False
        self._move(Page("search"))
        assert self._obs is not None
        return self._obs

    def step(self, action: str) -> StepResult:
        if self._obs is None:
            raise CatalogueError("WebShopEnv.step: call reset() first")
        if self._done:
            return StepResult(self._obs, 0.0, True, self._info(False, "episode is over"))
        self._turn += 1
        target, reason = self._resolve(action)
        extra: dict[str, Any] = {}
        reward, score, won = 0.0, 0.0, False
        if target is not None:
            self._move(target)
            if target.kind == "done":
                goal = self.goal
                product = self.catalogue.product(target.asin)
                chosen = (v for _, v in target.chosen)
                result = score_purchase(product, goal, chosen, self._nouns)
                score, won = result.score, result.score == 1.0
                reward = SUCCESS_REWARD if won else 0.0
                self._done = True
                self._move(target, score)
                extra["purchase"] = {
                    "asin": product.asin,
                    "options": dict(target.chosen),
                    "attributes_matched": result.attributes,
                    "options_matched": result.options,
                    "price_ok": result.price_ok,
                    "r_type": result.type.r_type,
                    "title_score": result.type.title_score,
                }
        truncated = not self._done and self._turn >= self.max_turns
        self._done = self._done or truncated
        info = self._info(target is not None, reason, won=won, score=score, truncated=truncated)
        info.update(extra)
        assert self._obs is not None
        return StepResult(self._obs, reward, self._done, info)

    def expert_action(self) -> str:
        if self._obs is None or self._done:
            raise CatalogueError("WebShopEnv.expert_action: no episode in progress; call reset()")
        return expert_action(
            self._page,
            self._view,
            self.catalogue,
            self.goal,
            self._fit,
            per_page=self.per_page,
            top_n=self.top_n,
        )

    # ------------------------------------------------------------------ read-only views
    @property
    def noun_tagger_name(self) -> str:
        """What r_type's title nouns come from: "rules" or "spacy:<model>"."""
        return self._nouns.name

    @property
    def goal(self) -> Goal:
        if self._goal is None:
            raise CatalogueError("WebShopEnv: call reset() first")
        return self._goal

    @property
    def page(self) -> Page:
        return self._page

    @property
    def observation(self) -> Observation:
        if self._obs is None:
            raise CatalogueError("WebShopEnv: call reset() first")
        return self._obs

    @property
    def context(self) -> Context:
        return self.observation.context

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        """Pickles carry the options, not the catalogue: it is rebuilt (cached) on load."""
        state = dict(self.__dict__)
        del state["catalogue"], state["_nouns"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.catalogue = _catalogue(self._source)
        self._nouns = _tagger(*self._tagger_options)

    # ------------------------------------------------------------------ internals
    def _resolve(self, action: Any) -> tuple[Page | None, str]:
        if not isinstance(action, str):
            return None, "action is not text"
        if len(action) > self.max_action_chars:
            return None, f"action longer than {self.max_action_chars} characters"
        m = _ACTION.fullmatch(action)
        if m is None:
            return None, "not of the form search[...] or click[...]"
        verb, arg = m.group(1).lower(), m.group(2).strip()
        if not arg:
            return None, f"empty {verb}[]"
        if verb == "search":
            if not self._view.has_search_bar:
                return None, "no search bar on this page"
            if not (arg.isascii() and arg.isprintable()):
                return None, "search query must be printable ASCII"
            return search(arg), ""
        target = click(self._page, self._view, self.catalogue, arg)
        return target, "" if target is not None else f"nothing to click named {arg[:40]!r}"

    def _move(self, page: Page, score: float = 0.0) -> None:
        self._page = page
        self._view = render(
            page, self.catalogue, per_page=self.per_page, top_n=self.top_n, score=score
        )
        goal = self.goal
        context = page_context(page, self._view, self.catalogue, goal, self._fit)
        actions = ((SEARCH_PLACEHOLDER,) if self._view.has_search_bar else ()) + tuple(
            f"click[{c}]" for c in self._view.clickables
        )
        self._obs = Observation(self._view.text, goal.instruction, actions, context, goal.category)

    def _fit(self, index: int) -> ProductFit:
        fit = self._fits.get(index)
        if fit is None:
            product = self.catalogue.products[index]
            fit = self._fits[index] = product_fit(product, self.goal, self._nouns)
        return fit

    def _info(
        self,
        valid: bool,
        reason: str,
        *,
        won: bool = False,
        score: float = 0.0,
        truncated: bool = False,
    ) -> dict[str, Any]:
        assert self._obs is not None
        return {
            "won": won,
            "score": score,
            "action_valid": valid,
            "invalid_reason": reason,
            "turn": self._turn,
            "page": self._page.kind,
            "truncated": truncated,
            "preview": self._obs.context.progress_value,
        }


def _catalogue(source: tuple[tuple[Any, ...], tuple[Any, ...]]) -> Catalogue:
    """The (cached) catalogue for the constructor's options."""
    (num_products, seed, goals_per_product, num_valid, unseen_fraction), paths = source
    products_path, attributes_path, goals_path = paths
    if products_path is None:
        return generated_catalogue(
            num_products,
            seed,
            goals_per_product,
            100 if num_valid is None else num_valid,
            0.2 if unseen_fraction is None else unseen_fraction,
        )
    return load_catalogue(
        str(products_path),
        str(attributes_path) if attributes_path else None,
        str(goals_path) if goals_path else None,
        seed=seed,
    )


def _tagger(kind: str, model: str, webshop_files: bool) -> NounTagger:
    """The title-noun tagger for the options (module docstring), announced once per process."""
    for name, value in (("noun_tagger", kind), ("spacy_model", model)):
        if not isinstance(value, str) or not value:
            raise CatalogueError(f"WebShopEnv: {name} must be a non-empty string, got {value!r}")
    try:
        tagger = noun_tagger(kind if kind != "auto" or webshop_files else "rules", model)
    except NounTaggerError as err:
        raise CatalogueError(f"WebShopEnv: {err}") from None
    data = "WebShop's files" if webshop_files else "the generated catalogue"
    if (data, tagger.name) not in _ANNOUNCED:
        _ANNOUNCED.add((data, tagger.name))
        if tagger.name == "rules":
            how = "the rule-based noun fallback (not WebShop's spaCy tags; docs/envs/webshop.md §3)"
        else:
            how = f"spaCy {tagger.name.split(':', 1)[1]!r} NOUN/PROPN tags, as WebShop"
        logger.info("WebShop r_type on %s: title nouns from %s", data, how)
    return tagger
