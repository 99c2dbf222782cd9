"""The generated catalogue, written in the schema of WebShop's own data files.

``generate_records(num_products, seed)`` returns the three JSON objects WebShop reads
(items_shuffle products, items_ins_v2 attributes, items_human_ins goals); they go through
the same parser as the real files (schema.py), so the loader is exercised on every run, and
``write_records`` dumps them under WebShop's file names.

Products cycle through the 25 product types of vocabulary.py (about 40 per type in the
default 1000), each with a brand, 3-5 of its type's attribute phrases, a non-empty subset of
every option list and a price drawn from the type's range (ending in .99). The title holds
the brand, the first two attributes and the type noun; the features page has one line per
attribute and the description names them all, so WebShop's substring rule finds them too.

Each product gets ``goals_per_product`` instructions: 1-3 of its attributes, one value of
every option type, text from a template ("i need waterproof and lightweight hiking boots
for men with color: brown, and size: 9"); the loader appends WebShop's price clause. The
product itself meets every criterion, so each goal has a product scoring 1.0.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path
from typing import Any

from mcgpo.envs.webshop.catalogue import Catalogue
from mcgpo.envs.webshop.schema import catalogue_from_records
from mcgpo.envs.webshop.vocabulary import BRANDS, INSTRUCTION_TEMPLATES, PRODUCT_TYPES

__all__ = [
    "FILE_NAMES",
    "generate_records",
    "generated_catalogue",
    "write_records",
]

FILE_NAMES = ("items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json")
_ASIN_CHARS = "0123456789ABCDEFGHJKLMNPQRSTUVWXYZ"
_CLOSINGS = (
    "Backed by a 30 day return policy.",
    "Ships in recyclable packaging.",
    "Designed and tested by our own team.",
    "A favourite of our customers.",
)


def generate_records(
    num_products: int = 1000, seed: int = 0, goals_per_product: int = 2
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(items_shuffle list, items_ins_v2 dict, items_human_ins dict), fixed by ``seed``."""
    if num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")
    if goals_per_product < 1:
        raise ValueError(f"goals_per_product must be >= 1, got {goals_per_product}")
    rng = random.Random(seed)
    products: list[dict[str, Any]] = []
    attributes: dict[str, Any] = {}
    human: dict[str, Any] = {}
    asins: set[str] = set()
    for i in range(num_products):
        kind = PRODUCT_TYPES[i % len(PRODUCT_TYPES)]
        asin = _asin(rng, asins)
        brand = rng.choice(BRANDS[kind.category])
        attrs = rng.sample(kind.attributes, rng.randint(3, min(5, len(kind.attributes))))
        options = {}
        for name, values in kind.options:
            keep = sorted(
                rng.sample(range(len(values)), rng.randint(min(2, len(values)), len(values)))
            )
            options[name] = [values[j] for j in keep]
        price = max(1.0, round(rng.uniform(*kind.price))) - 0.01
        noun = kind.noun.title() + (f" {kind.suffix}" if kind.suffix else "")
        title = f"{brand} {attrs[0].title()} {attrs[1].title()} {noun}"
        head = kind.noun + (f" {kind.suffix.lower()}" if kind.suffix else "")
        description = f"The {brand} {head} is {_join(attrs)}. {rng.choice(_CLOSINGS)}"
        products.append(
            {
                "asin": asin,
                "name": title,
                "full_description": description,
                "small_description": [f"{a.capitalize()} {kind.noun}" for a in attrs],
                "pricing": f"${price:.2f}",
                "customization_options": {
                    name: [{"value": v, "image": None} for v in values]
                    for name, values in options.items()
                },
                "images": [],
                "category": kind.category,
                "query": kind.query,
                "product_category": kind.product_category,
            }
        )
        goals = [_goal(rng, head, attrs, options) for _ in range(goals_per_product)]
        human[asin] = goals
        attributes[asin] = {
            "attributes": attrs,
            "instruction": goals[0]["instruction"].split(" with ")[0],
            "instruction_attributes": goals[0]["instruction_attributes"],
        }
    return products, attributes, human


@lru_cache(maxsize=8)
def generated_catalogue(
    num_products: int = 1000,
    seed: int = 0,
    goals_per_product: int = 2,
    num_valid: int = 100,
    unseen_fraction: float = 0.2,
) -> Catalogue:
    """The generated catalogue with its human-style goals (cached: it is immutable).

    Its splits are mcgpo's own (train / valid_seen / valid_unseen, catalogue.py), not
    WebShop's: the same records loaded as files (``write_records``) get WebShop's.
    """
    products, attributes, human = generate_records(num_products, seed, goals_per_product)
    return catalogue_from_records(
        products,
        attributes,
        human,
        seed=seed,
        scheme="generated",
        num_valid=num_valid,
        unseen_fraction=unseen_fraction,
        source="generated",
    )


def write_records(
    directory: str | Path, num_products: int = 1000, seed: int = 0, goals_per_product: int = 2
) -> tuple[Path, Path, Path]:
    """Write the generated records under WebShop's file names; returns the three paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = tuple(out / name for name in FILE_NAMES)
    for path, data in zip(paths, generate_records(num_products, seed, goals_per_product)):
        path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return paths  # type: ignore[return-value]


def _goal(
    rng: random.Random, head: str, attrs: list[str], options: dict[str, list[str]]
) -> dict[str, Any]:
    wanted = rng.sample(attrs, rng.randint(1, min(3, len(attrs))))
    chosen = {name: rng.choice(values) for name, values in options.items()}
    text = rng.choice(INSTRUCTION_TEMPLATES).format(attrs=_join(wanted), noun=head)
    if chosen:
        text += " with " + ", and ".join(f"{k}: {v}" for k, v in chosen.items())
    return {
        "instruction": text,
        "instruction_attributes": wanted,
        "instruction_options": list(chosen.values()),
    }


def _asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice(_ASIN_CHARS) for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
