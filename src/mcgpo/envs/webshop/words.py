"""Word lists and tokenisers of search (BM25) and the goal scorer's colour normalisation.

* ``search_tokens``: what the search index sees. Lower-case ASCII alphanumeric runs, Lucene's
  33-word English stop list removed (the list pyserini's default analyser uses, and so real
  WebShop's index), then Harman's "S" stemmer (plural -> singular) where Lucene applies the
  Porter stemmer: a departure that keeps the code short; it matters only for ranking.
* ``COLOR_SET``: WebShop's colour vocabulary (``web_agent_site/engine/normalize.py``), in its
  order, used by ``normalize_color`` before options are compared.
"""

from __future__ import annotations

import re

__all__ = [
    "COLOR_SET",
    "LUCENE_STOP_WORDS",
    "s_stem",
    "search_tokens",
]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


LUCENE_STOP_WORDS = _words(
    "a an and are as at be but by for if in into is it no not of on or such that the their "
    "then there these they this to was will with"
)

# WebShop's colour set, in WebShop's (alphabetical) order: normalize_color returns the
# first entry that is a substring of the option value.
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black",
    "blue", "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel",
    "champagne", "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark", "denim", "eggplant",
    "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite", "grass", "gray",
    "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon",
    "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight",
    "mint", "mocha", "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red", "rose", "royal",
    "rust", "sand", "sapphire", "seashell", "silver", "skull", "slate", "steel", "stone",
    "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise", "violet", "walnut",
    "wheat", "white", "wine", "yellow",
)  # fmt: skip

_ALNUM = re.compile(r"[a-z0-9]+")


def s_stem(word: str) -> str:
    """Harman's S stemmer: -ies -> -y, -es -> -e, -s -> '' (with its three exceptions)."""
    if len(word) > 3 and word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if len(word) > 2 and word.endswith("s") and not word.endswith(("us", "ss")):
        return word[:-1]
    return word


def search_tokens(text: str) -> list[str]:
    """Index/query terms of ``text``: lower-case alphanumeric runs, no stop words, S-stemmed."""
    return [s_stem(t) for t in _ALNUM.findall(text.lower()) if t not in LUCENE_STOP_WORDS]
