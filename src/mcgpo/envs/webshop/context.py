"""MCGPO context keys of a WebShop page (protocol ``Context``), canonical strings.

anchor        the page text exactly (``Observation.text``).
state         h(s): page kind + identity fields. The identity of a results page is its
              query and page number; of an item page its product and chosen options (the
              query and results page behind it only decide where "< Prev" leads, and the
              page does not show them, so they are left out):
                page=search
                page=results|query=waterproof hiking boots|page_no=2
                page=item|asin=B0QS2GYXRK|options=color:brown,size:9
                page=item_sub|sub=Features|asin=B0QS2GYXRK|options=color:brown
state_coarse  h(s) without identity fields: page kind, sub-page, which option names are chosen:
                page=results        page=item|chosen=color,size
progress      C, the goal scorer's view of the current product and chosen options (item and
              item_sub pages; "none" elsewhere): one bit per goal attribute and goal option
              (goal order), the price test, r_type and the preview score (the score Buy Now
              would give now):
                attrs=10|opts=01|price=1|r_type=1|preview=0.6000
progress_value  that preview score (0.0 off product pages).
enabled       F, criteria the agent can advance from this page, comma-separated, sorted:
                opt:<i>  goal option i is not matched and one of this item page's values
                         would match it
                buy      an item page (Buy Now is here)
                product  a results page listing a product that can reach score 1.0
              and "" when nothing is actionable (search, sub-pages, done).
"""

from __future__ import annotations

from collections.abc import Callable

from mcgpo.envs.protocol import Context
from mcgpo.envs.webshop.catalogue import Catalogue, Goal
from mcgpo.envs.webshop.goal_reward import goal_option_keys, key_matches, score_value
from mcgpo.envs.webshop.pages import Page, View
from mcgpo.envs.webshop.product_fit import ProductFit

__all__ = ["page_context", "preview"]

FitOf = Callable[[int], ProductFit]  # product index -> its fit for the episode's goal


def preview(page: Page, goal: Goal, fit: ProductFit) -> tuple[tuple[bool, ...], float]:
    """(goal options matched by the chosen values, score Buy Now would give now)."""
    opts = key_matches((v for _, v in page.chosen), goal_option_keys(goal))
    return opts, score_value(fit.type.r_type, fit.attributes, opts, fit.price_ok)


def page_context(
    page: Page, view: View, catalogue: Catalogue, goal: Goal, fit_of: FitOf
) -> Context:
    options = ",".join(f"{n}:{v}" for n, v in page.chosen)
    chosen_names = ",".join(n for n, _ in page.chosen)
    if page.kind == "search":
        return Context(view.text, "page=search", "page=search", "none", "", 0.0)
    if page.kind == "results":
        state = f"page=results|query={page.query}|page_no={page.page_no}"
        listed_ok = any(fit_of(i).complete for i in view.listed)
        return Context(view.text, state, "page=results", "none", "product" if listed_ok else "")
    product_index = catalogue.by_asin[page.asin]
    fit = fit_of(product_index)
    opts, value = preview(page, goal, fit)
    progress = (
        f"attrs={_bits(fit.attributes)}|opts={_bits(opts)}|price={int(fit.price_ok)}"
        f"|r_type={fit.type.r_type:g}|preview={value:.4f}"
    )
    identity = f"asin={page.asin}|options={options}"
    if page.kind == "item":
        # the fit's candidates are this product's own values, all clickable here
        enabled = ["buy"] + [
            f"opt:{i}" for i, hit in enumerate(opts) if not hit and fit.candidates[i]
        ]
        return Context(
            view.text,
            f"page=item|{identity}",
            f"page=item|chosen={chosen_names}",
            progress,
            ",".join(sorted(enabled)),
            value,
        )
    if page.kind == "item_sub":
        return Context(
            view.text,
            f"page=item_sub|sub={page.sub}|{identity}",
            f"page=item_sub|sub={page.sub}|chosen={chosen_names}",
            progress,
            "",
            value,
        )
    return Context(view.text, f"page=done|{identity}", "page=done", progress, "", value)


def _bits(flags: tuple[bool, ...]) -> str:
    return "".join("1" if f else "0" for f in flags)
