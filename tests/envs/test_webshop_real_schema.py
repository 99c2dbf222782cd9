"""WebShop's own file schema on a hand-made catalogue: WebShop's splits, synthetic-goal option
pairs, every loader error, and WebShop's test_goal.py cases re-derived as golden tests.

No WebShop file or data is used: the products below are written by hand in WebShop's schema
(items_shuffle / items_ins_v2 / items_human_ins), with Amazon-style Title Case names.
benchmarks/bench_webshop_nouns.py measures the noun fallback on these titles too.
"""

from __future__ import annotations

import json
import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.envs.webshop import CatalogueError, WebShopEnv, catalogue_from_records, load_catalogue
from mcgpo.envs.webshop.catalogue import WEBSHOP_SPLITS, Goal, Product, _webshop_splits
from mcgpo.envs.webshop.goal_reward import (
    attribute_matches,
    goal_option_keys,
    option_matches,
    score_purchase,
    type_reward,
)
from mcgpo.envs.webshop.title_nouns import noun_tagger, rule_nouns

# (name, category, query, product_category, options) of hand-written Amazon-style products
TITLES = [
    ("Death Wish Coffee Co Ground Coffee Dark Roast, 16 Ounce", "grocery", "ground coffee",
     "Grocery & Gourmet Food › Beverages › Coffee › Ground Coffee",
     {"Size": ["16 Ounce", "2 Pound"], "Flavor Name": ["Dark Roast", "Medium Roast"]}),
    ("Amazon Brand - Solimo Medium Roast Coffee Pods, 100 Count", "grocery", "coffee pods",
     "Grocery & Gourmet Food › Beverages › Coffee › Single-Serve Capsules & Pods", None),
    ("Twinings English Breakfast Black Tea Bags, 100 Count", "grocery", "black tea",
     "Grocery & Gourmet Food › Beverages › Tea › Black", {"Size": ["20 Count", "100 Count"]}),
    ("Walker Edison Furniture Modern Wood Storage Bookcase with 5 Shelves, Walnut", "furniture",
     "bookcase", "Home & Kitchen › Furniture › Home Office Furniture › Bookcases",
     {"Color": ["Walnut", "Black", "White Oak"]}),
    ("Zinus Shalini Upholstered Platform Bed Frame, Queen, Dark Grey", "furniture", "bed frame",
     "Home & Kitchen › Furniture › Bedroom Furniture › Beds & Bed Frames",
     {"Size": ["Twin", "Full", "Queen", "King"], "Color": ["Dark Grey", "Light Grey"]}),
    ("Mainstays 3-Shelf Bookcase, Black Oak", "furniture", "bookcase",
     "Home & Kitchen › Furniture › Living Room Furniture › Bookcases", None),
    ("Nike Men's Revolution 6 Running Shoe, Black/White, 10", "fashion", "men's running shoes",
     "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running",
     {"Color": ["Black/White", "Grey/Blue"], "Size": ["9", "10", "11"]}),
    ("Hanes Women's Short Sleeve Crew Neck T-Shirt, Light Blue, Large", "fashion",
     "women's t-shirt", "Clothing, Shoes & Jewelry › Women › Clothing › Tops, Tees & Blouses",
     {"Color": ["Light Blue", "Navy"], "Size": ["Small", "Medium", "Large", "X-Large"]}),
    ("PEAK High Top Mens Basketball Shoes Breathable Non Slip Outdoor Sneakers", "fashion",
     "basketball shoes", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Basketball",
     {"Size": ["8.5", "9", "10"]}),
    ("Anker Soundcore 2 Portable Bluetooth Speaker with Stereo Sound, Red", "electronics",
     "bluetooth speaker", "Electronics › Portable Audio & Video › Portable Speakers & Docks",
     {"Color": ["Black", "Red", "Blue"]}),
    ("Amazon Basics High-Speed HDMI Cable, 6 Feet, 2-Pack", "electronics", "hdmi cable",
     "Electronics › Accessories & Supplies › Audio & Video Accessories › Cables",
     {"Size": ["3 Feet", "6 Feet", "10 Feet"]}),
    ("BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic DVD/VCR Combo", "electronics",
     "power cord", "Electronics › Accessories & Supplies › Audio & Video Accessories › Power Cables",
     None),
    ("CeraVe Moisturizing Cream for Normal to Dry Skin, 16 Ounce", "beauty", "face moisturizer",
     "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
     {"Size": ["8 Ounce", "16 Ounce"]}),
    ("Maybelline New York SuperStay Matte Ink Liquid Lipstick, Lover", "beauty", "lipstick",
     "Beauty & Personal Care › Makeup › Lips › Lipstick", {"Color": ["Lover", "Pioneer"]}),
    ("Minkissy 2pcs Stainless Steel Eyebrow Tweezers Blackhead Acne Remover (Silver)", "beauty",
     "tweezers", "Beauty & Personal Care › Tools & Accessories › Makeup Brushes & Tools › Tweezers",
     None),
    ("Rusticware 921ORB Kitchen and Bath Cabinet Knob", "furniture", "cabinet knob",
     "Tools & Home Improvement › Hardware › Cabinet Hardware › Knobs", None),
]  # fmt: skip


def _records() -> tuple[list[dict], dict, dict]:
    """(items_shuffle, items_ins_v2, items_human_ins) of the hand-made catalogue."""
    products, attributes, human = [], {}, {}
    for i, (name, category, query, path, options) in enumerate(TITLES):
        asin = f"B0HAND{i:04d}"
        products.append(
            {"asin": asin, "name": name, "full_description": f"{name}. Made to last.",
             "small_description": [f"Feature {j} of {name}" for j in range(2)],
             "pricing": f"${10 + 3 * i}.99", "images": [""], "category": category,
             "query": query, "product_category": path,
             "customization_options": None if options is None else {
                 k: [{"value": v, "image": None} for v in vs] for k, vs in options.items()}}
        )  # fmt: skip
        first = {k: vs[0] for k, vs in (options or {}).items()}
        attributes[asin] = {"attributes": ["long lasting", query], "instruction": f"i need {query}",
                            "instruction_attributes": [query]}  # fmt: skip
        # many goals per product, so that WebShop's index ranges (0-499, 500-1499, 1500-)
        # are all non-empty: 16 products x 100 goals = 1,600 goals
        human[asin] = [{"instruction": f"i want {query} number {j}.",
                        "instruction_attributes": [query],
                        "instruction_options": list(first.values())} for j in range(100)]  # fmt: skip
    return products, attributes, human


def _write(tmp_path, records=None) -> list[str]:
    names = ("items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json")
    paths = []
    for name, data in zip(names, records or _records()):
        (tmp_path / name).write_text(json.dumps(data), encoding="utf-8")
        paths.append(str(tmp_path / name))
    return paths


# ---------------------------------------------------------------------------- splits


def test_webshop_files_use_webshops_index_splits(tmp_path):
    cat = load_catalogue(*_write(tmp_path))
    assert cat.scheme == "webshop" and len(cat.goals) == 1600
    # WebShop: random.seed(233); random.shuffle(goals); test = shuffled[0:500], eval =
    # [500:1500], train = [1500:]. Our goals keep file order; the same permutation indexes it.
    order = list(range(1600))
    random.Random(233).shuffle(order)
    assert cat.splits["test"] == tuple(order[:500])
    assert cat.splits["eval"] == tuple(order[500:1500])
    assert cat.splits["train"] == tuple(order[1500:])
    assert cat.splits["train_and_eval"] == tuple(order[500:])  # verl-agent's training range
    assert cat.splits["valid_seen"] == cat.splits["eval"]
    # goal i of "test" is WebShop's session i of its test split
    assert cat.goal("test", 7) is cat.goals[order[7]]
    assert sorted(cat.splits["test"] + cat.splits["eval"] + cat.splits["train"]) == list(
        range(1600)
    )


def test_webshop_split_rule_is_the_global_shuffle():
    # random.Random(233).shuffle is the permutation of random.seed(233); random.shuffle
    state = random.getstate()
    try:
        random.seed(233)
        goals = list(range(2000))
        random.shuffle(goals)
    finally:
        random.setstate(state)
    mine = list(range(2000))
    random.Random(233).shuffle(mine)
    assert goals == mine
    assert dict(WEBSHOP_SPLITS)["test"] == (0, 500) and WEBSHOP_SPLITS["eval"] == (500, 1500)


def test_empty_split_names_the_split_and_its_size(tmp_path):
    products, attributes, human = _records()
    small = {k: v[:10] for k, v in human.items()}  # 160 goals: only "test" has goals
    paths = _write(tmp_path, (products, attributes, small))
    env = WebShopEnv(products_path=paths[0], attributes_path=paths[1], goals_path=paths[2])
    env.reset(seed=3, split="test")
    with pytest.raises(
        CatalogueError,
        match=r"split 'train' has no goals: it is WebShop's shuffled goals 1500 to the end and "
        r"this catalogue has 160 goals",
    ):
        env.reset(seed=0, split="train")
    with pytest.raises(CatalogueError, match=r"split 'eval' has no goals: .* goals 500-1499"):
        env.reset(seed=0, split="eval")
    with pytest.raises(CatalogueError, match=r"unknown split 'valid_unseen'; known: test, eval"):
        env.reset(seed=0, split="valid_unseen")


def test_split_options_of_the_generated_catalogue_are_refused_on_files(tmp_path):
    paths = _write(tmp_path)
    with pytest.raises(CatalogueError, match="num_valid / unseen_fraction split the generated"):
        WebShopEnv(products_path=paths[0], goals_path=paths[2], num_valid=10)


def test_generated_catalogue_keeps_its_own_splits_and_names_them():
    env = WebShopEnv(num_products=100)
    env.reset(seed=0, split="valid_unseen")
    with pytest.raises(CatalogueError, match=r"'test' and 'eval' exist only for WebShop's files"):
        env.reset(seed=0, split="test")
    with pytest.raises(
        CatalogueError, match=r"split 'train' has no goals: the generated catalogue"
    ):
        WebShopEnv(num_products=25, num_valid=100).reset(seed=0, split="train")


# ---------------------------------------------------------------------------- synthetic goals


def test_synthetic_goals_keep_option_names_and_score_pairs(tmp_path):
    products, attributes, _ = _records()
    paths = _write(tmp_path, (products, attributes, {}))
    cat = load_catalogue(paths[0], paths[1], None)
    bed = [g for g in cat.goals if g.asin == "B0HAND0004"]
    # options sorted by name: color (2 values) x size (4) -> 8 goals
    assert len(bed) == 8 and bed[0].option_names == ("color", "size")
    assert bed[0].options == ("dark grey", "twin")
    # WebShop scores dict.items(): ("color", "dark grey") is no colour word by tuple
    # membership, so it stays a pair; thefuzz compares str(pair) = "('color', 'dark grey')",
    # processed to "color    dark grey" (tokens color, dark, grey).
    assert goal_option_keys(bed[0]) == ("('color', 'dark grey')", "('size', 'twin')")


def _goal(options, names=()):
    return Goal("B1", "i need it", ("x",), tuple(options), 100.0, "Widget", "q", "c", "a › b",
                option_names=tuple(names))  # fmt: skip


def test_pair_matching_differs_from_value_matching_as_webshop_does():
    # chosen "dark grey" -> normalize_color -> "dark" (first COLOR_SET word contained).
    # Human goal option "dark grey" -> "dark": token_set_ratio("dark", "dark") = 100 -> match.
    human = _goal(["dark grey"])
    # Synthetic: the pair ("color", "dark grey") stays a pair: "dark" vs "color dark grey":
    # intersection "dark", so token_set_ratio = 100 -> match as well.
    synthetic = _goal(["dark grey"], ["color"])
    p = Product("B1", "Widget", "c", "q", "a › b", "", (), "$1", 1.0, (), ("x",))
    assert score_purchase(p, human, ["dark grey"]).options == (True,)
    assert score_purchase(p, synthetic, ["dark grey"]).options == (True,)
    # chosen "light grey" -> "grey"; human goal "dark grey" -> "dark": ratio("grey", "dark")
    # = 25 -> no match. Synthetic pair "color dark grey" contains "grey" -> 100 -> match.
    assert score_purchase(p, human, ["light grey"]).options == (False,)
    assert score_purchase(p, synthetic, ["light grey"]).options == (True,)
    # a value equal to a colour word: tuple membership finds it -> the pair becomes "navy";
    # chosen "navy blue" -> "blue": ratio("blue", "navy") = 25 -> no match (both kinds)
    assert goal_option_keys(_goal(["navy"], ["color"])) == ("navy",)
    assert score_purchase(p, _goal(["navy"], ["color"]), ["navy blue"]).options == (False,)
    # the option name is a token of the pair: chosen "size" matches ("size", "xl")
    assert score_purchase(p, _goal(["xl"], ["size"]), ["size"]).options == (True,)
    assert option_matches(["size"], ["xl"]) == (False,)


# ---------------------------------------------------------------------------- loader errors


def _mutated(tmp_path, which, mutate):
    records = list(_records())
    records[which] = json.loads(json.dumps(records[which]))
    mutate(records[which])
    return _write(tmp_path, records)


@pytest.mark.parametrize(
    ("which", "mutate", "message"),
    [
        (1, lambda a: a["B0HAND0001"].update(attributes="high speed"),
         r"items_ins_v2_1000\.json: attributes: asin B0HAND0001: field 'attributes' must be a "
         r"list of strings, got a string"),
        (1, lambda a: a.update(B0HAND0002="oops"),
         r"items_ins_v2_1000\.json: attributes: asin B0HAND0002: expected an object"),
        (1, lambda a: a["B0HAND0003"].update(attributes=["ok", 3]),
         r"items_ins_v2_1000\.json: attributes: asin B0HAND0003: field 'attributes' must be a "
         r"list of strings$"),
        (2, lambda g: g["B0HAND0000"][1].update(instruction_attributes="ground coffee"),
         r"items_human_ins\.json: goals: asin B0HAND0000 instruction 1: field "
         r"'instruction_attributes' must be a list of strings, got a string"),
        (2, lambda g: g["B0HAND0000"][0].update(instruction_options="16 ounce"),
         r"items_human_ins\.json: goals: asin B0HAND0000 instruction 0: field "
         r"'instruction_options' must be a list of strings, got a string"),
        (2, lambda g: g["B0HAND0001"].__setitem__(0, "a text"),
         r"items_human_ins\.json: goals: asin B0HAND0001 instruction 0: expected an object"),
        (2, lambda g: g.update(B0HAND0002={"instruction": "x"}),
         r"items_human_ins\.json: goals: asin B0HAND0002: expected a list of instructions"),
        (0, lambda p: p[3].update(customization_options={"Color": "Walnut"}),
         r"items_shuffle_1000\.json: products: record 3: option 'Color': expected a list"),
        (0, lambda p: p[2].update(query=None),
         r"items_shuffle_1000\.json: products: record 2: field 'query' missing or not text"),
    ],
)  # fmt: skip
def test_loader_errors_name_their_own_file_record_and_field(tmp_path, which, mutate, message):
    paths = _mutated(tmp_path, which, mutate)
    with pytest.raises(CatalogueError, match=message):
        load_catalogue(*paths)


def test_synthetic_loader_errors_name_the_attributes_file(tmp_path):
    products, attributes, _ = _records()
    attributes["B0HAND0005"]["instruction_attributes"] = "bookcase"
    paths = _write(tmp_path, (products, attributes, {}))
    with pytest.raises(
        CatalogueError,
        match=r"items_ins_v2_1000\.json: attributes: asin B0HAND0005: field "
        r"'instruction_attributes' must be a list of strings, got a string",
    ):
        load_catalogue(paths[0], paths[1], None)
    attributes["B0HAND0005"] = {"instruction": 5}
    paths = _write(tmp_path, (products, attributes, {}))
    with pytest.raises(CatalogueError, match=r"asin B0HAND0005: field 'instruction' must be text"):
        load_catalogue(paths[0], paths[1], None)


def test_attributes_as_webshop_reads_them():
    products, attributes, human = _records()
    attributes["B0HAND0001"] = {"instruction": "i need pods"}  # no "attributes" key
    attributes["B0HAND0002"]["attributes"] = []  # present and empty: kept empty, as WebShop
    products[3]["customization_options"]["color"] = [{"value": "Cherry"}]  # same lower name
    cat = catalogue_from_records(products, attributes, human)
    assert cat.products[1].attributes == ("DUMMY_ATTR",)
    assert cat.products[2].attributes == ()
    # WebShop's options dict: "Color" and "color" are one key; the later values replace
    assert cat.products[3].options == (("color", ("cherry",)),)


# ---------------------------------------------------------------------------- WebShop's test_goal.py


def _p(name="Name 1", query="Query 1", path="a › b › c", attributes=(), bullets=(),
       description="") -> Product:  # fmt: skip
    return Product("B2", name, "c", query, path, description, tuple(bullets), "$1", 1.0, (),
                   tuple(attributes))  # fmt: skip


def _g(name="Name 1", query="Query 1", path="a › b › c", attributes=(), options=(), names=(),
       bound=40.0) -> Goal:  # fmt: skip
    return Goal("B2", "i need it", tuple(attributes), tuple(options), bound, name, query, "c",
                path, option_names=tuple(names))  # fmt: skip


def test_goal_py_type_reward_cases():
    # Exact match: same query, paths share 3 levels, nouns ["name"] both -> title score 1/1
    t = type_reward(_p(), _g())
    assert (t.r_type, t.query_match, t.category_match, t.title_score) == (1.0, True, True, 1.0)
    assert not type_reward(_p(query="Query 2"), _g()).query_match
    # category levels as sets: {b, c, a} & {a, b, c} = 3; {d, e, f} = 0; {a, d, b} -> {a, b} = 2;
    # {a, a, b} -> {a, b} = 2; {a, a, d} -> {a} = 1 (needs >= 2)
    for path, match in (("b › c › a", True), ("d › e › f", False), ("a › d › b", True),
                        ("a › a › b", True), ("a › a › d", False)):  # fmt: skip
        assert type_reward(_p(path=path), _g()).category_match is match, path


def test_goal_py_title_scores_with_the_rule_fallback():
    # WebShop's test asserts title_score ~ 0.333 here (spaCy). Rules: goal nouns of "Mens
    # D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White" = mens, d.o.n., issue,
    # gca, basketball, sneakers, shoes, casual, off, white (10; "2" is a number); bought
    # "PEAK High Top Mens Basketball Shoes ... Outdoor Sneakers" shares mens, basketball,
    # sneakers, shoes -> 4/10 (spaCy tags words of the bought title as ADJ or VERB).
    goal = _g("Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White")
    bought = _p("PEAK High Top Mens Basketball Shoes Lou Williams Streetball Master Breathable "
                "Non Slip Outdoor Sneakers")  # fmt: skip
    assert type_reward(bought, goal).title_score == pytest.approx(4 / 10)
    # "Completely different product names": no shared noun -> title score 0 (< 0.05 in WebShop)
    far = type_reward(_p("Minkissy 2pcs Stainless Steel Eyebrow Tweezers Blackhead Acne Remover "
                         "Portable Makeup Tweezers (Silver)"),
                      _g("Rusticware 921ORB Kitchen and Bath Cabinet Knob"))  # fmt: skip
    assert far.title_score == 0.0 and far.r_type == 0.0


def test_goal_py_attribute_reward_cases():
    goal = _g(attributes=["tea tree", "essential oils", "natural ingredients"])
    # exact: "essential oil" vs "essential oils": token_set_ratio = Indel ratio of the two
    # strings, 1 - 1/27 = 96.3 > 85 -> all 3 matched
    exact = _p(attributes=["tea tree", "essential oil", "natural ingredients"])
    assert attribute_matches(exact, goal) == (True, True, True)
    # partial: "tea tree" nowhere -> 2 of 3
    partial = _p(attributes=["essential oil", "natural ingredients"])
    assert attribute_matches(partial, goal) == (False, True, True)
    # found in features ("essential oils") and description ("natural ingredients"): 2 of 3
    text = _p(bullets=["This shampoo has essential oils and smells like lemons"],
              description="Best shampoo on the market, made with natural ingredients")  # fmt: skip
    assert attribute_matches(text, goal) == (False, True, True)
    # no match: "tea bag" vs "tea tree" = 1 - 6/14 = 57; the title "english tea for breakfast"
    # does not contain "tea tree" -> 0 of 3
    none = _p("English tea for breakfast", attributes=["tea bag", "earl gray", "lipton"],
              bullets=["Soothing aroma", "Calming, great feeling"],
              description="Best tea made by Lipton, great to pair with breakfast")  # fmt: skip
    assert attribute_matches(none, goal) == (False, False, False)


def test_goal_py_option_reward_cases():
    # exact: every goal value chosen -> 3 of 3; "grey" -> "grey", "XL" and "pack of 12" stay
    assert option_matches(["pack of 12", "grey", "XL"], ["grey", "XL", "pack of 12"]) == (
        True,
        True,
        True,
    )
    # partial: "blue" instead of "grey" -> 2 of 3
    assert option_matches(["pack of 12", "blue", "XL"], ["grey", "XL", "pack of 12"]) == (
        False,
        True,
        True,
    )
    # fuzzy: "powder snow" tokens inside "cool powder snow" -> 100 -> 3 of 3
    assert all(option_matches(["pack of 12", "powder snow", "XL"], ["cool powder snow", "XL",
                                                                    "pack of 12"]))  # fmt: skip
    assert option_matches(["goal 1", "goal 2"], []) == ()  # no goal options
    assert option_matches([], ["goal 1", "goal 2"]) == (False, False)  # nothing chosen


def test_goal_py_get_reward_cases():
    # goal options as WebShop's dict {"color": "grey", "size": "XL"}: ("color", "grey") is a
    # colour word by tuple membership -> "grey"; ("size", "XL") stays the pair and "XL" is a
    # token subset of "size xl" -> both matched. Attributes 3/3, price 35 <= 40:
    # 1.0 * (3 + 2 + 1) / (3 + 2 + 1) = 1
    name = "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White"
    attrs = ["tea tree", "essential oils", "natural ingredients"]
    goal = _g(name, attributes=attrs, options=["grey", "XL"], names=["color", "size"])
    bought = Product("B2", name, "c", "Query 1", "a › b › c", "", (), "$35", 35.0, (),
                     ("tea tree", "essential oil", "natural ingredients"))  # fmt: skip
    assert score_purchase(bought, goal, ["grey", "XL"]).score == 1.0
    # attributes from the text only: "essential oils" (features), "natural ingredients"
    # (description) -> 2 of 3: (2 + 2 + 1) / 6 = 0.8333. (WebShop's own test asserts 2/3
    # within 0.01 here and passes only because its BulletPoints is a plain string whose
    # ' '.join spaces out every character, so "essential oils" is not found: 4/6.)
    text = bought.__class__(**{**bought.__dict__, "attributes": (),
                               "bullets": ("This shampoo has essential oils and smells like lemons",),
                               "description": "Best shampoo on the market, made with natural "
                                              "ingredients"})  # fmt: skip
    assert score_purchase(text, goal, ["grey", "XL"]).score == pytest.approx(5 / 6)
    spaced = bought.__class__(**{**text.__dict__, "bullets": tuple(
        "This shampoo has essential oils and smells like lemons")})  # fmt: skip
    assert score_purchase(spaced, goal, ["grey", "XL"]).score == pytest.approx(4 / 6)
    # a third goal option ("amount", "pack of 12") not chosen: (1 + 2 + 1) / (3 + 3 + 1) = 4/7
    three = _g(name, attributes=attrs, options=["grey", "XL", "pack of 12"],
               names=["color", "size", "amount"])  # fmt: skip
    assert score_purchase(spaced, three, ["grey", "XL"]).score == pytest.approx(4 / 7)
    # r_type 0.5: no query match, paths "a › d › e" and "a › b › c" share one level, and the
    # titles share 2 of the goal's 14 rule nouns (saireed ul listed prong power cord jbl bar
    # bar channel 4k ultra hd soundbar; "2", "3.1", "2.1" are numbers, "for" an ADP):
    # 2/14 = 0.143, in [0.1, 0.2] -> 0.5 (spaCy: 0.15). Score 0.5 * 4/7 = 0.2857, as WebShop.
    far = _g("Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD "
             "Soundbar", attributes=attrs, options=["grey", "XL", "pack of 12"],
             names=["color", "size", "amount"])  # fmt: skip
    cord = spaced.__class__(**{**spaced.__dict__, "query": "Query 2", "product_category":
                               "a › d › e", "name": "BRST AC Power Cord Outlet Socket Cable Plug "
                               "Lead for Panasonic SC-HT830V DVD/VCR Combo Home Theater "
                               "System"})  # fmt: skip
    result = score_purchase(cord, far, ["grey", "XL"])
    assert result.type.title_score == pytest.approx(2 / 14) and result.type.r_type == 0.5
    assert result.score == pytest.approx(0.5 * 4 / 7)


# ---------------------------------------------------------------------------- r_type source


def test_the_env_says_once_which_r_type_it_uses(tmp_path, caplog):
    paths = _write(tmp_path)
    import mcgpo.envs.webshop.env as env_module

    env_module._ANNOUNCED.clear()
    with caplog.at_level(logging.INFO, logger="mcgpo.envs.webshop.env"):
        a = WebShopEnv(products_path=paths[0], goals_path=paths[2], noun_tagger="rules")
        WebShopEnv(products_path=paths[0], goals_path=paths[2], noun_tagger="rules")
    lines = [r.getMessage() for r in caplog.records if "r_type" in r.getMessage()]
    assert lines == [
        "WebShop r_type on WebShop's files: title nouns from the rule-based noun fallback "
        "(not WebShop's spaCy tags; docs/envs/webshop.md §3)"
    ]
    assert a.noun_tagger_name == "rules"


def test_bad_noun_tagger_options_are_one_line_errors():
    with pytest.raises(CatalogueError, match="noun_tagger must be one of auto, spacy, rules"):
        WebShopEnv(noun_tagger="nltk")
    with pytest.raises(
        CatalogueError, match=r"spacy_model must be a non-empty string, got \['x'\]"
    ):
        WebShopEnv(spacy_model=["x"])
    with pytest.raises(CatalogueError, match=r"spaCy model '/no/such/model' does not load|spaCy "
                       r"is not installed"):  # fmt: skip
        WebShopEnv(noun_tagger="spacy", spacy_model="/no/such/model")


def test_auto_falls_back_to_the_rules_when_the_model_is_missing(tmp_path, caplog):
    paths = _write(tmp_path)
    with caplog.at_level(logging.WARNING):
        env = WebShopEnv(products_path=paths[0], goals_path=paths[2],
                         spacy_model="/no/such/model")  # fmt: skip
    assert env.noun_tagger_name == "rules"
    assert any("using the rule-based noun fallback" in r.getMessage() for r in caplog.records)
    assert noun_tagger("auto", "/no/such/model").name == "rules"


def test_rule_nouns_on_the_hand_made_titles():
    # colour, size and material words stay nouns (spaCy tags them PROPN in Title Case):
    # the old heuristic kept only "death wish co ground" of the first title
    assert rule_nouns(TITLES[0][0]) == ("death", "wish", "coffee", "co", "ground", "coffee",
                                        "dark", "roast", "ounce")  # fmt: skip
    assert rule_nouns(TITLES[4][0]) == ("zinus", "shalini", "upholstered", "platform", "bed",
                                        "frame", "queen", "dark", "grey")  # fmt: skip
    assert "wood" in rule_nouns(TITLES[3][0]) and "storage" in rule_nouns(TITLES[3][0])


# ---------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4000))
def test_webshop_splits_partition_the_goals_for_any_size(n):
    splits = _webshop_splits(n)
    test, dev, train = (set(splits[k]) for k in ("test", "eval", "train"))
    assert not (test & dev) and not (test & train) and not (dev & train)
    assert test | dev | train == set(range(n))
    assert len(test) == min(n, 500) and len(dev) == max(0, min(n, 1500) - 500)
    assert set(splits["train_and_eval"]) == dev | train and splits["valid_seen"] == splits["eval"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80))
def test_rule_nouns_are_lower_case_words_never_numbers_or_closed_class(title):
    for noun in rule_nouns(title):
        assert noun == noun.lower() and noun in title.lower()
        assert not noun.replace(".", "").replace(",", "").isdigit()
        assert noun not in {"for", "with", "and", "the", "of", "x"}


def test_expert_wins_synthetic_goals_scored_as_pairs(tmp_path):
    products, attributes, _ = _records()
    paths = _write(tmp_path, (products, attributes, {}))
    env = WebShopEnv(products_path=paths[0], attributes_path=paths[1], max_turns=20)
    wins = 0
    for seed in range(40):
        env.reset(seed=seed, split="test")
        done = False
        while not done:
            res = env.step(env.expert_action())
            done = res.done
        wins += res.info["won"]
    # every target can reach 1.0 with its own option values (pairs contain them)
    assert wins == 40
