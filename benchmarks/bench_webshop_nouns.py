"""How close the rule-based noun fallback comes to a spaCy pipeline's NOUN/PROPN tags.

    python benchmarks/bench_webshop_nouns.py --model en_core_web_sm   # a name or a folder

Measured on three title sets: the built-in generated catalogue (its distinct titles),
the hand-made real-schema catalogue of tests/envs/test_webshop_real_schema.py, and the
titles of WebShop's own test_goal.py; on words: WebShop's colour list, and the generated
catalogue's attribute and option words, each in a Title Case product name; and on
purchases: r_type and the total score with each tagger, for every (goal, product) pair of
the real-schema catalogue and for 300 goals x 20 products of the generated one (the goal's
options chosen, so r_type is what differs). Prints a Markdown table (docs/envs/webshop.md §3).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from mcgpo.envs.webshop import catalogue_from_records, generated_catalogue
from mcgpo.envs.webshop.catalogue import Catalogue
from mcgpo.envs.webshop.goal_reward import score_purchase
from mcgpo.envs.webshop.title_nouns import SpacyNouns, rule_nouns
from mcgpo.envs.webshop.vocabulary import PRODUCT_TYPES
from mcgpo.envs.webshop.words import COLOR_SET

Nouns = Callable[[str], tuple[str, ...]]
ROOT = Path(__file__).resolve().parent.parent
WEBSHOP_TEST_TITLES = (
    "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White",
    "PEAK High Top Mens Basketball Shoes Lou Williams Streetball Master Breathable Non Slip "
    "Outdoor Sneakers",
    "Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar "
    "Home Theater System Subwoofer",
    "BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home "
    "Theater System",
    "Rusticware 921ORB Kitchen and Bath Cabinet Knob",
    "Minkissy 2pcs Stainless Steel Eyebrow Tweezers Blackhead Acne Remover Portable Makeup "
    "Tweezers (Silver)",
)


def real_schema_module():
    path = ROOT / "tests" / "envs" / "test_webshop_real_schema.py"
    spec = importlib.util.spec_from_file_location("webshop_real_schema", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def title_agreement(titles: Iterable[str], spacy_nouns: Nouns) -> tuple[int, float, float, float]:
    """(titles, share with identical noun lists, recall and precision of the rules' nouns)."""
    titles = sorted(set(titles))
    same = hit = want = got = 0
    for t in titles:
        ref, mine = spacy_nouns(t), rule_nouns(t)
        same += ref == mine
        common = sum(min(ref.count(w), mine.count(w)) for w in set(ref))
        hit, want, got = hit + common, want + len(ref), got + len(mine)
    return len(titles), same / len(titles), hit / max(want, 1), hit / max(got, 1)


def word_agreement(words: Sequence[str], frame: str, spacy_nouns: Nouns) -> tuple[int, float]:
    """(words, share where spaCy and the rules agree on 'noun') for each word set in ``frame``."""
    agree = 0
    for w in words:
        title = frame.format(w.title())
        ref, mine = set(spacy_nouns(title)), set(rule_nouns(title))
        parts = w.lower().replace("-", " ").split()
        agree += all((p in ref) == (p in mine) for p in parts)
    return len(words), agree / len(words)


def purchase_agreement(
    cat: Catalogue, pairs: Iterable[tuple[int, int]], spacy_nouns: Nouns
) -> tuple[int, float, float, int]:
    """(purchases, share equal r_type, share equal score, success flips) for (goal, product)."""
    n = same_type = same_score = flips = 0
    for gi, pi in pairs:
        goal, product = cat.goals[gi], cat.products[pi]
        a = score_purchase(product, goal, goal.options, spacy_nouns)
        b = score_purchase(product, goal, goal.options, rule_nouns)
        n += 1
        same_type += a.type.r_type == b.type.r_type
        same_score += a.score == b.score
        flips += (a.score == 1.0) != (b.score == 1.0)
    return n, same_type / n, same_score / n, flips


def generated_pairs(cat: Catalogue, goals: int, per_goal: int) -> list[tuple[int, int]]:
    """Each sampled goal with its top search hits and random products (common purchases)."""
    rng = random.Random(0)
    pairs = []
    for gi in rng.sample(range(len(cat.goals)), goals):
        goal = cat.goals[gi]
        hits = list(cat.search(" ".join(goal.attributes) + " " + goal.query, per_goal // 2))
        hits += rng.sample(range(len(cat.products)), per_goal - len(hits))
        pairs += [(gi, pi) for pi in hits]
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="en_core_web_sm", help="spaCy pipeline name or folder")
    args = parser.parse_args(argv)
    spacy_nouns = SpacyNouns(args.model)
    real = real_schema_module()
    generated = generated_catalogue()
    products, attributes, human = real._records()
    hand = catalogue_from_records(products, attributes, {k: v[:1] for k, v in human.items()})
    gen_titles = [p.name for p in generated.products]
    hand_titles = [t[0] for t in real.TITLES]
    attr_words = sorted({a for k in PRODUCT_TYPES for a in k.attributes})
    option_words = sorted({v for k in PRODUCT_TYPES for _, vs in k.options for v in vs})
    print(f"spaCy pipeline: {args.model}\n")
    print("| titles | n | identical noun lists | recall | precision |\n|---|---|---|---|---|")
    for label, titles in (
        ("generated catalogue", gen_titles),
        ("hand-made real-schema catalogue", hand_titles),
        ("WebShop test_goal.py", WEBSHOP_TEST_TITLES),
    ):
        n, same, recall, precision = title_agreement(titles, spacy_nouns)
        print(f"| {label} | {n} | {same:.1%} | {recall:.1%} | {precision:.1%} |")
    print("\n| words (in a Title Case name) | n | noun / not noun agree |\n|---|---|---|")
    for label, words, frame in (
        ("WebShop colour list", COLOR_SET, "Acme Cotton T-Shirt, {}"),
        ("generated attribute phrases", attr_words, "Acme {} Widget"),
        ("generated option values", option_words, "Acme Widget, {}"),
    ):
        n, agree = word_agreement(words, frame, spacy_nouns)
        print(f"| {label} | {n} | {agree:.1%} |")
    print("\n| purchases | n | same r_type | same score | success flips |\n|---|---|---|---|---|")
    hand_pairs = [(g, p) for g in range(len(hand.goals)) for p in range(len(hand.products))]
    for label, cat, pairs in (
        ("real-schema: every goal x product", hand, hand_pairs),
        ("generated: 300 goals x 20 products", generated, generated_pairs(generated, 300, 20)),
    ):
        n, same_type, same_score, flips = purchase_agreement(cat, pairs, spacy_nouns)
        print(f"| {label} | {n} | {same_type:.1%} | {same_score:.1%} | {flips} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
