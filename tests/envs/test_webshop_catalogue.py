"""The WebShop catalogue: loader on hand-made files in WebShop's schema, price rule, splits,
and the generated catalogue (no real WebShop data is used or vendored)."""

from __future__ import annotations

import json
import random
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.envs.webshop import (
    CatalogueError,
    WebShopEnv,
    generated_catalogue,
    load_catalogue,
    score_purchase,
    write_records,
)
from mcgpo.envs.webshop.catalogue import PRICE_RANGE, price_upper
from mcgpo.envs.webshop.goal_reward import fuzzy_match, normalize_color
from mcgpo.envs.webshop.vocabulary import PRODUCT_TYPES

# A hand-made items_shuffle file: three good products, one with asin "nan" and one repeat
# (both skipped, as WebShop does).
PRODUCTS = [
    {"asin": "B0TEST0001", "name": "Acme Trail Boots", "full_description": "Tough boots.",
     "small_description": ["Waterproof leather", "Rubber sole"], "pricing": "$9.98 to $16.98",
     "customization_options": {"Color": [{"value": "Dark Brown", "image": "x.jpg"},
                                         {"value": "Black/Grey", "image": None}],
                               "Size": [{"value": " 9 "}], "Style": None},
     "images": ["x.jpg"], "category": "fashion", "query": "Hiking Boots ",
     "product_category": "Clothing › Men › Shoes", "brand": "Acme"},
    {"asin": "B0TEST0002", "name": "Zen Green Tea", "full_description": "",
     "small_description": "Organic leaves", "pricing": "$985.00",
     "customization_options": None, "images": [], "category": "food", "query": "green tea",
     "product_category": "Grocery › Beverages › Tea"},
    {"asin": "B0TEST0003", "name": "Plain Mug", "full_description": "A mug.",
     "small_description": [], "pricing": "", "customization_options": {},
     "images": [], "category": "furniture", "query": "mug", "product_category": "Home › Kitchen"},
    {"asin": "nan", "name": "Broken", "category": "x", "query": "x", "product_category": "x"},
    {"asin": "B0TEST0001", "name": "Repeat", "category": "x", "query": "x", "product_category": "x"},
]  # fmt: skip
ATTRIBUTES = {
    "B0TEST0001": {"attributes": ["waterproof", "rubber sole"], "instruction": "i need boots",
                   "instruction_attributes": ["waterproof"]},
    "B0TEST0002": {"attributes": ["organic"]},
}  # fmt: skip
HUMAN_GOALS = {
    "B0TEST0001": [
        {"instruction": "i want waterproof boots in dark brown.",
         "instruction_attributes": ["waterproof"], "instruction_options": ["dark brown", "9"]},
        {"instruction": "no attributes here", "instruction_attributes": [],
         "instruction_options": []},
    ],
    "B0TEST0002": [{"instruction": "organic green tea", "instruction_attributes": ["organic"],
                    "instruction_options": []}],
}  # fmt: skip


def _write(tmp_path, products=PRODUCTS, attributes=ATTRIBUTES, goals=HUMAN_GOALS):
    paths = []
    for name, data in (("items_shuffle_1000.json", products), ("items_ins_v2_1000.json", attributes),
                       ("items_human_ins.json", goals)):  # fmt: skip
        path = tmp_path / name
        path.write_text(json.dumps(data), encoding="utf-8")
        paths.append(str(path))
    return paths


def test_loader_reads_webshops_product_schema(tmp_path):
    cat = load_catalogue(*_write(tmp_path))
    assert [p.asin for p in cat.products] == ["B0TEST0001", "B0TEST0002", "B0TEST0003"]
    boots, tea, mug = cat.products
    assert boots.query == "hiking boots"  # lower-cased and stripped
    # option names lower-cased; values stripped, lower-cased, "/" -> " | "; null options dropped
    assert boots.options == (("color", ("dark brown", "black | grey")), ("size", ("9",)))
    assert boots.price_tag == "$9.98 to $16.98" and 9.98 <= boots.price <= 16.98
    assert boots.bullets == ("Waterproof leather", "Rubber sole")
    assert boots.attributes == ("waterproof", "rubber sole")
    assert tea.bullets == ("Organic leaves",) and tea.price == 985.0
    assert mug.price == 100.0 and mug.price_tag == "$100.0"  # no pricing -> 100.0
    assert mug.attributes == ("DUMMY_ATTR",)  # no items_ins_v2 entry


def test_loader_human_goals_and_price_clause(tmp_path):
    cat = load_catalogue(*_write(tmp_path))
    # the goal without attributes is skipped: 2 goals remain
    assert len(cat.goals) == 2
    by_asin = {g.asin: g for g in cat.goals}
    boots, tea = by_asin["B0TEST0001"], by_asin["B0TEST0002"]
    # price p in [9.98, 16.98]: the first four multiples of 10 above p are 10..40 (p < 10)
    # or 20..50 (p >= 10); two are sampled and the larger kept, so never the first one.
    # The trailing "." of the instruction is stripped.
    first = 10.0 if cat.product(boots.asin).price < 10 else 20.0
    assert boots.price_upper in (first + 10, first + 20, first + 30)
    assert boots.instruction == (
        f"i want waterproof boots in dark brown, and price lower than {boots.price_upper:.2f} dollars"
    )
    assert boots.options == ("dark brown", "9") and boots.name == "Acme Trail Boots"
    # 985.0: only 990 lies above it -> no bound (10**6) and no clause
    assert tea.price_upper == 1_000_000.0 and tea.instruction == "organic green tea"
    # the target product with the goal options scores 1.0
    assert score_purchase(cat.product(boots.asin), boots, boots.options).score == 1.0


def test_loader_synthetic_goals_without_goals_file(tmp_path):
    products, attributes, _ = _write(tmp_path)
    cat = load_catalogue(products, attributes, None)
    # only B0TEST0001 has an instruction; options color (2 values) x size (1) -> 2 goals
    assert sorted(g.options for g in cat.goals) == [("black | grey", "9"), ("dark brown", "9")]
    texts = sorted(g.instruction.split(", and price")[0] for g in cat.goals)
    assert texts[1] == "i need boots with color: dark brown, and size: 9"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p[0].pop("name"), r"record 0: field 'name' missing or not text"),
        (
            lambda p: p[1].update(pricing=12),
            r"record 1 \(B0TEST0002\): field 'pricing' must be text",
        ),
        (
            lambda p: p[1].update(pricing="$abc$1.2.3"),
            r"record 1 \(B0TEST0002\): unreadable pricing",
        ),
        (
            lambda p: p[0].update(customization_options={"color": ["red"]}),
            r"record 0: option 'color': expected a list",
        ),
        (lambda p: p.append("not a record"), r"record 5: expected an object"),
    ],
)
def test_loader_errors_name_the_file_record_and_field(tmp_path, mutate, message):
    products = json.loads(json.dumps(PRODUCTS))
    mutate(products)
    paths = _write(tmp_path, products=products)
    with pytest.raises(CatalogueError, match=r"items_shuffle_1000\.json: products: " + message):
        load_catalogue(*paths)


def test_loader_file_errors(tmp_path):
    with pytest.raises(CatalogueError, match="products_path: no such file"):
        load_catalogue(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(CatalogueError, match=r"products_path bad\.json: not valid JSON"):
        load_catalogue(str(bad))
    products, _, _ = _write(tmp_path)
    with pytest.raises(CatalogueError, match="need a goals file or an attributes file"):
        load_catalogue(products)
    goals = tmp_path / "g.json"
    goals.write_text(
        json.dumps({"B0TEST0001": [{"instruction_attributes": ["x"]}]}), encoding="utf-8"
    )
    with pytest.raises(CatalogueError, match="instruction 0: field 'instruction' missing"):
        load_catalogue(products, None, str(goals))
    with pytest.raises(CatalogueError, match="goals_path need products_path"):
        WebShopEnv(goals_path=str(goals))


def test_env_runs_on_loaded_files(tmp_path):
    products, attributes, goals = _write(tmp_path)
    # num_valid / unseen_fraction are gone for WebShop's files; with 2 goals only WebShop's
    # "test" split (goals 0-499) has goals
    env = WebShopEnv(products_path=products, attributes_path=attributes, goals_path=goals)
    env.reset(seed=0, split="test")
    done, steps = False, 0
    while not done:
        res = env.step(env.expert_action())
        done, steps = res.done, steps + 1
    assert res.info["won"] and res.reward == 10.0 and steps <= 6


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=0.0, max_value=1200.0, allow_nan=False), st.integers(0, 10**6))
def test_price_bound_rule(price, seed):
    bound, clause = price_upper(price, random.Random(seed))
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        assert (bound, clause) == (1_000_000.0, "")
    else:
        # the larger of two distinct draws from the first four: never the first one
        assert bound in above[1:] and bound > price
        assert clause == f", and price lower than {bound:.2f} dollars"


def test_generated_splits_are_disjoint_fixed_and_hold_out_categories():
    cat = generated_catalogue()
    train, seen, unseen = (set(cat.splits[s]) for s in ("train", "valid_seen", "valid_unseen"))
    assert not (train & seen) and not (train & unseen) and not (seen & unseen)
    assert train | seen | unseen == set(range(len(cat.goals)))
    assert len(seen) == 100
    train_paths = {cat.goals[i].product_category for i in train}
    unseen_paths = {cat.goals[i].product_category for i in unseen}
    assert unseen_paths == cat.unseen_product_categories and not (train_paths & unseen_paths)
    # one of the five product types held out in each of the five top-level categories
    assert (
        sorted(p.split(" › ")[0] for p in unseen_paths)
        == sorted({t.product_category.split(" › ")[0] for t in PRODUCT_TYPES})
        and len(unseen_paths) == 5
    )
    again = generated_catalogue.__wrapped__()  # rebuilt, not the cached object
    assert again.goals == cat.goals and dict(again.splits) == dict(cat.splits)


def test_written_records_load_back_to_the_same_catalogue(tmp_path):
    paths = write_records(tmp_path, num_products=60, seed=5)
    loaded = load_catalogue(*map(str, paths), seed=5)
    built = generated_catalogue(num_products=60, seed=5)
    assert loaded.products == built.products and loaded.goals == built.goals


def test_every_generated_goal_is_met_by_its_target():
    cat = generated_catalogue()
    for g in cat.goals:
        assert score_purchase(cat.product(g.asin), g, g.options).score == 1.0, g


def test_option_values_and_attributes_of_a_type_never_match_each_other():
    for kind in PRODUCT_TYPES:
        for _, values in kind.options:
            for a, b in combinations(values, 2):
                assert not fuzzy_match(normalize_color(a), normalize_color(b)), (kind.key, a, b)
        for a, b in combinations(kind.attributes, 2):
            assert not fuzzy_match(a, b), (kind.key, a, b)


def test_unknown_split_and_bad_options():
    cat = generated_catalogue()
    with pytest.raises(CatalogueError, match="unknown split 'test'"):
        cat.goal("test", 0)
    with pytest.raises(CatalogueError, match="unseen_fraction must be in"):
        generated_catalogue(num_products=30, unseen_fraction=1.0)
