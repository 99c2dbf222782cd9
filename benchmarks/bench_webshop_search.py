"""Does a BM25 library rank the built-in catalogue as mcgpo's own BM25 (envs/webshop/search.py)?

    pip install bm25s rank-bm25
    python benchmarks/bench_webshop_search.py

Every goal of the generated catalogue gives two queries: the expert's ("<goal attributes>
<goal query>") and the raw instruction. Each library gets the same tokens (words.search_tokens)
and BM25 parameters (k1 = 0.9, b = 0.4); a query term counts once, as in search.py. For each
query the top 50 (WebShop's SEARCH_RETURN_N) of each library are compared with ours: the
share of identical lists (same products in the same order), of identical sets, and the
largest score difference where the idf is the same. Prints a Markdown table
(docs/envs/webshop.md §8.1).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from mcgpo.envs.webshop import generated_catalogue
from mcgpo.envs.webshop.catalogue import _document
from mcgpo.envs.webshop.words import search_tokens

K = 50
Ranker = Callable[[list[str]], tuple[int, ...]]


def _top(scores: np.ndarray, k: int) -> tuple[int, ...]:
    """Documents with a positive score, best first, ties by index (search.py's rule)."""
    matching = np.flatnonzero(scores > 0.0)
    return tuple(int(i) for i in matching[np.lexsort((matching, -scores[matching]))][:k])


def bm25s_ranker(corpus: list[list[str]]) -> tuple[Ranker, Callable[[list[str]], np.ndarray]]:
    import bm25s

    index = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    index.index(corpus, show_progress=False)

    def scores(query: list[str]) -> np.ndarray:
        return np.asarray(index.get_scores(sorted(set(query))), dtype=np.float64)

    return (lambda q: _top(scores(q), K)), scores


def rank_bm25_ranker(corpus: list[list[str]]) -> Ranker:
    from rank_bm25 import BM25Okapi

    index = BM25Okapi(corpus, k1=0.9, b=0.4)
    return lambda q: _top(np.asarray(index.get_scores(sorted(set(q)))), K)


def compare(name: str, ranker: Ranker, queries: Sequence[str], ours: Callable) -> str:
    same_list = same_set = 0
    start = time.perf_counter()
    for q in queries:
        theirs, mine = ranker(search_tokens(q)), ours(q)
        same_list += theirs == mine
        same_set += set(theirs) == set(mine)
    ms = 1000 * (time.perf_counter() - start) / len(queries)
    n = len(queries)
    return f"| {name} | {n} | {same_list / n:.2%} | {same_set / n:.2%} | {ms:.2f} |"


def main() -> int:
    cat = generated_catalogue()
    corpus = [search_tokens(_document(p)) for p in cat.products]
    queries = [" ".join(g.attributes) + " " + g.query for g in cat.goals]
    queries += [g.instruction for g in cat.goals]

    def ours(q: str) -> tuple[int, ...]:
        return _top(cat.index.scores(q), K)

    print("| library | queries | identical top-50 lists | identical top-50 sets | ms / query |")
    print("|---|---|---|---|---|")
    bm25s_rank, bm25s_scores = bm25s_ranker(corpus)
    print(compare("bm25s 'lucene'", bm25s_rank, queries, ours))
    print(compare("rank-bm25 BM25Okapi", rank_bm25_ranker(corpus), queries, ours))
    # bm25s's lucene variant has our idf and drops the (k1 + 1) factor: scores differ by it
    worst = max(
        float(np.max(np.abs(bm25s_scores(search_tokens(q)) * 1.9 - cat.index.scores(q))))
        for q in queries[:500]
    )
    print(f"\nlargest |1.9 * bm25s score - ours| over 500 queries: {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
