"""Golden tests of WebShop's task score on hand-made products (goal_reward.py).

score = r_type * (N_attr + N_opt + [price <= bound]) / (|attributes| + |options| + 1)
"""

from __future__ import annotations

import pytest
from rapidfuzz.fuzz import token_set_ratio

from mcgpo.envs.webshop.catalogue import Goal, Product
from mcgpo.envs.webshop.goal_reward import (
    attribute_matches,
    fuzzy_match,
    normalize_color,
    option_matches,
    score_purchase,
    score_value,
    type_reward,
)
from mcgpo.envs.webshop.title_nouns import rule_nouns as title_nouns

BOOT_PATH = "Clothing, Shoes & Jewelry › Men › Shoes › Outdoor › Hiking & Trekking"
MUG_PATH = "Home & Kitchen › Kitchen & Dining › Dining › Mugs"
TEA_PATH = "Grocery & Gourmet Food › Beverages › Tea"


def product(name="Trailpeak Waterproof Hiking Boots for Men", *, query="men's hiking boots",
            path=BOOT_PATH, price=39.99, attributes=("waterproof", "lace up"),
            description="Sturdy boots with a rubber sole.", bullets=("Ankle high",),
            options=(("color", ("brown", "black")), ("size", ("9", "10")))) -> Product:  # fmt: skip
    return Product("B000000001", name, "fashion", query, path, description, tuple(bullets),
                   f"${price}", price, options, tuple(attributes))  # fmt: skip


def goal(name="Trailpeak Waterproof Hiking Boots for Men", *, query="men's hiking boots",
         path=BOOT_PATH, attributes=("waterproof",), options=("brown", "9"),
         bound=40.0) -> Goal:  # fmt: skip
    return Goal("B000000001", "i need boots", tuple(attributes), tuple(options), bound, name,
                query, "fashion", path)  # fmt: skip


def test_full_match_scores_one():
    # attrs 1/1, options 2/2, price 39.99 <= 40, r_type 1 (same query) -> 1 * 4/4 = 1.0
    s = score_purchase(product(), goal(), ["brown", "9"])
    assert s.score == 1.0
    assert s.attributes == (True,) and s.options == (True, True) and s.price_ok


def test_partial_match_counts_each_criterion():
    # goal attributes: "waterproof" (a product attribute), "rubber sole" (substring of the
    # description), "non slip" (nowhere) -> 2 of 3. Options: "brown" chosen, "9" not
    # ("10" chosen: token_set_ratio("10", "9") = 0) -> 1 of 2. Price ok -> 1.
    # score = 1.0 * (2 + 1 + 1) / (3 + 2 + 1) = 4/6
    g = goal(attributes=("waterproof", "rubber sole", "non slip"))
    s = score_purchase(product(), g, ["brown", "10"])
    assert s.attributes == (True, True, False)
    assert s.options == (True, False)
    assert s.score == pytest.approx(4 / 6)


def test_attribute_found_in_title_and_features():
    # "hiking" is in the lower-cased title, "ankle high" in the features (bullets),
    # "lace" fuzzy-matches the product attribute "lace up": token_set_ratio("lace up", "lace")
    # = 100 (one token set contains the other); "gore tex" is nowhere.
    g = goal(attributes=("hiking", "ankle high", "lace", "gore tex"))
    assert attribute_matches(product(), g) == (True, True, True, False)


def test_price_bound_is_inclusive():
    # price 40.00 <= 40.0 -> ok: 4/4; price 40.01 > 40.0 -> 3/4 = 0.75
    assert score_purchase(product(price=40.0), goal(), ["brown", "9"]).score == 1.0
    s = score_purchase(product(price=40.01), goal(), ["brown", "9"])
    assert not s.price_ok and s.score == pytest.approx(0.75)


def test_rule_nouns_keep_title_case_words_and_drop_closed_classes():
    # The fallback in place of spaCy (title_nouns.py): every word but numbers and closed-class
    # words. en_core_web_sm 3.8 tags "Waterproof", "Hiking", "Boots" PROPN and "Men" NOUN, as
    # here; it tags "Trailpeak" VERB (the one word here the rules cannot get right), "for" ADP.
    assert title_nouns("Trailpeak Waterproof Hiking Boots for Men") == (
        "trailpeak",
        "waterproof",
        "hiking",
        "boots",
        "men",
    )
    # colour and size words are nouns (spaCy: PROPN PROPN PROPN), unlike the old heuristic
    assert title_nouns("Waterproof Black Large") == ("waterproof", "black", "large")
    assert title_nouns("Zorb Zorb Widget") == ("zorb", "zorb", "widget")
    # numbers and closed-class words are not (spaCy: ADP NUM ADP NUM)
    assert title_nouns("With 2 of 3") == ()


def test_r_type_one_by_query_match_with_low_title_overlap():
    # goal nouns [zorb, alpha, beta, gamma, delta] (5); bought [zorb, widget]: overlap 1/5 = 0.2,
    # not > 0.2, but the queries match -> r_type 1.0
    g = goal("Zorb Alpha Beta Gamma Delta", query="q", path=TEA_PATH)
    p = product("Zorb Widget", query="q", path=MUG_PATH)
    t = type_reward(p, g)
    assert (t.r_type, t.query_match, t.category_match, t.title_score) == (1.0, True, False, 0.2)


def test_r_type_one_by_category_match():
    # paths share "Clothing, Shoes & Jewelry" and "Men" (2 levels) -> category match -> 1.0
    g = goal("Zorb Alpha Beta Gamma Delta", query="q1")
    p = product("Zorb Widget", query="q2", path="Clothing, Shoes & Jewelry › Men › Shirts")
    assert type_reward(p, g).r_type == 1.0


def test_r_type_half_without_any_match():
    # no query match, paths share 0 levels, title score 0.2 (not > 0.2) -> 0.5;
    # 0.2 >= 0.1 so it stays 0.5. Full attribute/option/price match: 0.5 * 4/4 = 0.5
    g = goal("Zorb Alpha Beta Gamma Delta", query="q1", path=TEA_PATH)
    p = product("Zorb Widget", query="q2", path=MUG_PATH)
    assert type_reward(p, g).r_type == 0.5
    assert score_purchase(p, g, ["brown", "9"]).score == 0.5


def test_r_type_point_one_when_title_overlap_is_below_a_tenth():
    # goal name with 11 nouns, overlap 1 -> 1/11 = 0.0909 < 0.1 -> 0.1 even with query match
    g = goal("Zorb Xoa Xob Xoc Xod Xoe Xof Xog Xoh Xoi Xoj", query="q")
    assert len(title_nouns(g.name)) == 11
    t = type_reward(product("Zorb Widget", query="q"), g)
    assert t.title_score == pytest.approx(1 / 11) and t.r_type == 0.1


def test_r_type_zero_without_shared_nouns_even_with_query_and_category_match():
    t = type_reward(product("Corvane Sandals"), goal())  # same query and path, nouns disjoint
    assert t.query_match and t.category_match and t.title_score == 0.0 and t.r_type == 0.0
    assert score_purchase(product("Corvane Sandals"), goal(), ["brown", "9"]).score == 0.0


def test_goal_name_without_nouns_gives_title_score_point_two():
    t = type_reward(product("Zorb Widget", query="a", path=MUG_PATH),
                    goal("With 2 of 3", query="b", path=TEA_PATH))  # fmt: skip
    assert (t.title_score, t.r_type) == (0.2, 0.5)


def test_title_score_denominator_counts_repeated_nouns():
    # desired [zorb, zorb, widget] (3), bought [zorb, gadget]: |{zorb}| / 3
    t = type_reward(product("Zorb Gadget"), goal("Zorb Zorb Widget"))
    assert t.title_score == pytest.approx(1 / 3)


def test_fuzzy_match_at_the_threshold():
    # one token each, nothing shared: token_set_ratio = Indel ratio of the two strings,
    # 100 * (1 - distance / (len1 + len2)), distance = len1 + len2 - 2 * LCS.
    # 20 vs 20 characters, LCS 17 -> 1 - 6/40 = 85.0 -> not > 85
    a, b = "abcdefghijklmnopqrst", "abcdefghijklmnopqxyz"
    assert token_set_ratio(a, b) == pytest.approx(85.0)
    assert not fuzzy_match(a, b)
    # 7 vs 7, LCS 6 -> 1 - 2/14 = 85.71 -> rounds to 86 > 85
    assert fuzzy_match("abcdefg", "abcdefh")
    # 23 vs 24, LCS 20 -> 1 - 7/47 = 85.106: above 85 raw, but thefuzz rounds to 85 -> no match
    c, d = "abcdefghijklmnopqrst" + "uvw", "abcdefghijklmnopqrst" + "xyz1"
    assert token_set_ratio(c, d) == pytest.approx(100 * (1 - 7 / 47))
    assert not fuzzy_match(c, d)
    # one token set inside the other -> 100 ("large" matches "x-large": '-' becomes a space)
    assert fuzzy_match("large", "X-Large")


def test_colour_normalisation():
    # first COLOR_SET word (alphabetical) contained in the string
    assert normalize_color("light blue") == "blue"  # "blue" comes before "light"
    assert normalize_color("dark grey") == "dark"
    assert normalize_color("violet lavender") == "lavender"
    assert normalize_color("standard") == "tan"  # substring quirk kept from WebShop
    assert normalize_color("9") == "9"
    # normalisation can break a raw match: "navy blue" -> "blue" vs "navy" -> no match,
    # although token_set_ratio("navy blue", "navy") = 100
    assert option_matches(["navy blue"], ["navy"]) == (False,)
    # ... and make one: both "burgundy red" and "burgundy wine" -> "burgundy"
    assert not fuzzy_match("burgundy red", "burgundy wine")
    assert option_matches(["burgundy wine"], ["burgundy red"]) == (True,)


def test_one_chosen_value_can_match_several_goal_options():
    # "x-large" contains the token set of "large" and of "x-large" -> both matched
    assert option_matches(["x-large"], ["large", "x-large"]) == (True, True)
    assert option_matches([], ["large"]) == (False,)


def test_score_value_formula():
    # 0.5 * (1 + 1 + 1) / (2 + 1 + 1) = 0.375
    assert score_value(0.5, (True, False), (True,), True) == 0.375
    # no goal options: 1.0 * (1 + 0) / (1 + 0 + 1) = 0.5
    assert score_value(1.0, (True,), (), False) == 0.5
