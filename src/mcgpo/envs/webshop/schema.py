"""Reading WebShop's own data files (and our generated records, which use the same schema).

* ``items_shuffle_1000.json`` (``products_path``): a list of product dicts with ``asin``,
  ``name``, ``full_description``, ``small_description`` (string or list), ``pricing``
  ("$12.99", "$9.98 to $16.98" or empty), ``customization_options`` ({name: [{"value": ...,
  "image": ...}, ...]} or null), ``category``, ``query``, ``product_category``; other keys
  (images, brand, ...) are ignored. As in WebShop ``load_products``: records whose asin is
  "nan" or longer than 10 characters and repeated asins are skipped; option names are
  lower-cased (a repeated name replaces the earlier one's values, as in WebShop's dict);
  option values are stripped, lower-cased and "/" becomes " | ".
* ``items_ins_v2_1000.json`` (``attributes_path``): {asin: {"attributes": [...],
  "instruction": ..., "instruction_attributes": [...]}}. Products without an entry (or
  whose entry has no "attributes") get the attribute list ["DUMMY_ATTR"], as in WebShop.
* ``items_human_ins.json`` (``goals_path``): {asin: [{"instruction": ...,
  "instruction_attributes": [...], "instruction_options": [...]}, ...]}: human goals; an
  instruction without attributes is skipped (WebShop does the same).

Without a goals file, goals are WebShop's synthetic ones: every product whose items_ins_v2
entry has an ``instruction`` gives one goal per combination of its option values, the text
"<instruction> with <name>: <value>, and <name>: <value>" (option names sorted); the goal
keeps the option names, as WebShop scores (name, value) pairs (goal_reward.py).

Errors are one-line :class:`CatalogueError` naming the file, the record and the field; a
string where a list of strings is required is one of them (not a list of its characters).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path
from typing import Any

from mcgpo.envs.webshop.catalogue import (
    Catalogue,
    CatalogueError,
    Goal,
    Product,
    price_upper,
    sample_price,
)

__all__ = [
    "catalogue_from_records",
    "human_goals",
    "load_catalogue",
    "parse_products",
    "read_json",
    "synthetic_goals",
]

_REQUIRED = ("asin", "name", "category", "query", "product_category")


def read_json(path: str | Path, what: str) -> Any:
    """Load a JSON file; a missing or malformed file is a one-line CatalogueError."""
    p = Path(path)
    if not p.is_file():
        raise CatalogueError(f"{what}: no such file {str(p)!r}")
    try:
        with p.open(encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CatalogueError(f"{what} {p.name}: not valid JSON ({err})") from None


def parse_products(
    records: Any,
    attributes: Mapping[str, Any] | None,
    *,
    rng: random.Random,
    source: str = "products",
    attributes_source: str = "attributes",
    limit: int | None = None,
) -> list[Product]:
    """Products from items_shuffle records (+ items_ins_v2 attributes), WebShop's cleaning."""
    if not isinstance(records, list):
        raise CatalogueError(f"{source}: expected a list of product records")
    if limit is not None:
        records = records[:limit]
    seen: set[str] = set()
    products = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise CatalogueError(f"{source}: record {i}: expected an object")
        for key in _REQUIRED:
            if not isinstance(rec.get(key), str):
                raise CatalogueError(f"{source}: record {i}: field {key!r} missing or not text")
        asin = rec["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing, tag = _pricing(rec.get("pricing"), f"{source}: record {i} ({asin})")
        small = rec.get("small_description") or []
        bullets = tuple(small) if isinstance(small, list) else (str(small),)
        attrs = _product_attributes((attributes or {}).get(asin), asin, attributes_source)
        products.append(
            Product(
                asin=asin,
                name=rec["name"],
                category=rec["category"],
                query=rec["query"].lower().strip(),
                product_category=rec["product_category"],
                description=str(rec.get("full_description") or ""),
                bullets=tuple(str(b) for b in bullets),
                price_tag=tag,
                price=sample_price(pricing, rng),
                options=_options(rec.get("customization_options"), f"{source}: record {i}"),
                attributes=attrs,
            )
        )
    return products


def human_goals(
    products: Sequence[Product], human_ins: Any, *, rng: random.Random, source: str = "goals"
) -> list[Goal]:
    """Goals from items_human_ins records, in product order (WebShop ``get_human_goals``)."""
    if not isinstance(human_ins, dict):
        raise CatalogueError(f"{source}: expected an object mapping asin -> instructions")
    goals = []
    for p in products:
        entries = human_ins.get(p.asin)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise CatalogueError(f"{source}: asin {p.asin}: expected a list of instructions")
        for j, ins in enumerate(entries):
            where = f"{source}: asin {p.asin} instruction {j}"
            if not isinstance(ins, dict):
                raise CatalogueError(f"{where}: expected an object")
            attrs = _text_list(ins, "instruction_attributes", where)
            opts = _text_list(ins, "instruction_options", where)
            text = ins.get("instruction")
            if not isinstance(text, str):
                raise CatalogueError(f"{where}: field 'instruction' missing or not text")
            if not attrs:
                continue
            bound, clause = price_upper(p.price, rng)
            goals.append(_goal(p, text.strip(".") + clause, attrs, opts, bound))
    return goals


def synthetic_goals(
    products: Sequence[Product], attributes: Any, *, rng: random.Random, source: str = "attributes"
) -> list[Goal]:
    """WebShop's synthetic goals: one per option combination of every instructed product."""
    if not isinstance(attributes, dict):
        raise CatalogueError(f"{source}: expected an object mapping asin -> attributes")
    goals = []
    for p in products:
        entry = attributes.get(p.asin)
        if not isinstance(entry, dict) or entry.get("instruction") is None:
            continue  # WebShop skips products whose instruction is missing or null
        if not isinstance(entry["instruction"], str):
            raise CatalogueError(f"{source}: asin {p.asin}: field 'instruction' must be text")
        attrs = _text_list(entry, "instruction_attributes", f"{source}: asin {p.asin}")
        if not attrs:
            raise CatalogueError(f"{source}: asin {p.asin}: instruction without attributes")
        bound, clause = price_upper(p.price, rng)
        named = sorted(p.options)
        for combo in itertools.product(*(values for _, values in named)):
            pairs = [f"{name}: {value}" for (name, _), value in zip(named, combo)]
            with_options = " with " + ", and ".join(pairs) if pairs else ""
            text = entry["instruction"] + with_options + clause
            names = tuple(name for name, _ in named)
            goals.append(_goal(p, text, attrs, tuple(combo), bound, names))
    return goals


def _goal(
    p: Product,
    text: str,
    attrs: Sequence[str],
    opts: Sequence[str],
    bound: float,
    option_names: tuple[str, ...] = (),
) -> Goal:
    return Goal(
        asin=p.asin,
        instruction=text,
        attributes=tuple(attrs),
        options=tuple(opts),
        price_upper=bound,
        name=p.name,
        query=p.query,
        category=p.category,
        product_category=p.product_category,
        option_names=option_names,
    )


def _product_attributes(entry: Any, asin: str, source: str) -> tuple[str, ...]:
    """items_ins_v2 ``attributes`` of one product (WebShop: ["DUMMY_ATTR"] when absent)."""
    if entry is None:
        return ("DUMMY_ATTR",)
    if not isinstance(entry, dict):
        raise CatalogueError(f"{source}: asin {asin}: expected an object")
    if "attributes" not in entry:
        return ("DUMMY_ATTR",)
    return _text_list(entry, "attributes", f"{source}: asin {asin}")


def _text_list(entry: Any, key: str, where: str) -> tuple[str, ...]:
    value = entry.get(key, []) if isinstance(entry, dict) else None
    if value is None:
        return ()
    if isinstance(value, str):
        raise CatalogueError(f"{where}: field {key!r} must be a list of strings, got a string")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CatalogueError(f"{where}: field {key!r} must be a list of strings")
    return tuple(value)


def _pricing(value: Any, where: str) -> tuple[list[float], str]:
    """WebShop: split on '$', keep digits and dots of each part; the first two prices."""
    if not value:
        return [100.0], "$100.0"
    if not isinstance(value, str):
        raise CatalogueError(f"{where}: field 'pricing' must be text like '$12.99'")
    try:
        prices = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in value.split("$")[1:]]
    except InvalidOperation:
        raise CatalogueError(f"{where}: unreadable pricing {value!r}") from None
    if not prices:
        raise CatalogueError(f"{where}: unreadable pricing {value!r}")
    if len(prices) == 1:
        return prices, f"${prices[0]}"
    return prices[:2], f"${prices[0]} to ${prices[1]}"


def _options(value: Any, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not value:
        return ()
    if not isinstance(value, dict):
        raise CatalogueError(f"{where}: field 'customization_options' must be an object")
    out: dict[str, tuple[str, ...]] = {}
    for name, contents in value.items():
        if contents is None:
            continue
        if not isinstance(contents, list):
            raise CatalogueError(f"{where}: option {name!r}: expected a list of {{'value': text}}")
        try:
            values = tuple(c["value"].strip().replace("/", " | ").lower() for c in contents)
        except (TypeError, KeyError, AttributeError):
            raise CatalogueError(
                f"{where}: option {name!r}: expected a list of {{'value': text}}"
            ) from None
        out[name.lower()] = values
    return tuple(out.items())


def catalogue_from_records(
    products: Any,
    attributes: Mapping[str, Any] | None,
    human_ins: Mapping[str, Any] | None,
    *,
    seed: int = 0,
    scheme: str = "webshop",
    num_valid: int = 100,
    unseen_fraction: float = 0.2,
    limit: int | None = None,
    source: str = "records",
    files: tuple[str, str, str] | None = None,
) -> Catalogue:
    """A catalogue from records in WebShop's schema: human goals if given, else synthetic.

    ``scheme``: "webshop" (WebShop's fixed splits) or "generated" (mcgpo's own, with
    ``num_valid`` and ``unseen_fraction``; catalogue.py). ``files``: the names of the products,
    attributes and goals files, which then start each error message in place of ``source``.
    """
    where = files or (source, source, source)
    attr_source, goal_source = f"{where[1]}: attributes", f"{where[2]}: goals"
    if attributes is not None and not isinstance(attributes, dict):
        raise CatalogueError(f"{attr_source}: expected an object mapping asin -> entry")
    rng = random.Random(seed)
    items = parse_products(
        products,
        attributes,
        rng=rng,
        source=f"{where[0]}: products",
        attributes_source=attr_source,
        limit=limit,
    )
    if human_ins is not None:
        goals = human_goals(items, human_ins, rng=rng, source=goal_source)
    elif attributes is not None:
        goals = synthetic_goals(items, attributes, rng=rng, source=attr_source)
    else:
        raise CatalogueError(f"{where[0]}: need a goals file or an attributes file for goals")
    return Catalogue.build(
        items,
        goals,
        seed=seed,
        scheme=scheme,
        num_valid=num_valid,
        unseen_fraction=unseen_fraction,
    )


def load_catalogue(
    products_path: str | Path,
    attributes_path: str | Path | None = None,
    goals_path: str | Path | None = None,
    *,
    seed: int = 0,
    num_products: int | None = None,
) -> Catalogue:
    """A catalogue from WebShop's files (items_shuffle, items_ins_v2, items_human_ins).

    Splits are WebShop's (catalogue.py: ``test`` = goals 0-499 of its seed-233 shuffle,
    ``eval`` 500-1499, ``train`` 1500 on); ``seed`` drives the sampled prices and bounds.
    Cached on the paths, the files' sizes and modification times, and the options.
    """
    stamped = tuple(_stamp(p) for p in (products_path, attributes_path, goals_path))
    if stamped[0] is None:
        raise CatalogueError("products_path: a path to items_shuffle_*.json is required")
    return _load(*stamped, seed, num_products)


def _stamp(path: str | Path | None) -> tuple[str, int, int] | None:
    if path is None or path == "":
        return None
    p = Path(path)
    stat = p.stat() if p.is_file() else None
    return (str(p), stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)


@lru_cache(maxsize=8)
def _load(
    products: tuple[str, int, int] | None,
    attributes: tuple[str, int, int] | None,
    goals: tuple[str, int, int] | None,
    seed: int,
    num_products: int | None,
) -> Catalogue:
    names = tuple(Path(f[0]).name if f else "" for f in (products, attributes, goals))
    return catalogue_from_records(
        read_json(products[0], "products_path") if products else None,
        read_json(attributes[0], "attributes_path") if attributes else None,
        read_json(goals[0], "goals_path") if goals else None,
        seed=seed,
        scheme="webshop",
        limit=num_products,
        files=names,  # type: ignore[arg-type]
    )
