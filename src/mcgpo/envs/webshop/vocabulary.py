"""Word lists of the generated catalogue: product types, brands and instruction templates.

The five top-level categories are WebShop's own (beauty, electronics, fashion, food,
furniture); each holds five invented product types with an Amazon-style category path,
a search query, a pool of attribute phrases, option values and a price range. Brand names
are invented. Option values inside one option type are chosen so that no two of them match
each other under WebShop's option matcher (colour normalisation, then token-set ratio > 85;
tests/envs/test_webshop_catalogue.py checks it), so a goal option names exactly one value.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["BRANDS", "INSTRUCTION_TEMPLATES", "PRODUCT_TYPES", "ProductType"]


class ProductType(NamedTuple):
    key: str  # short id, e.g. "hiking_boots"
    category: str  # WebShop top-level category: beauty, electronics, fashion, food, furniture
    product_category: str  # Amazon-style path, levels joined by " › "
    query: str  # the search query the product was "scraped" with (WebShop's `query`)
    noun: str  # head noun phrase of titles and instructions
    suffix: str  # title suffix, e.g. "for Men"
    attributes: tuple[str, ...]  # attribute phrases (WebShop's `attributes`)
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (option name, values) in page order
    price: tuple[float, float]  # price range in dollars


_COLOURS_DARK = ("black", "brown", "grey", "navy", "olive", "khaki")
_COLOURS_BRIGHT = ("white", "red", "blue", "green", "pink", "yellow", "purple", "orange")
_CLOTHING_SIZES = ("small", "medium", "large", "xl", "xxl")

_B, _C, _E, _F, _H = (
    "Beauty & Personal Care",
    "Clothing, Shoes & Jewelry",
    "Electronics",
    "Grocery & Gourmet Food",
    "Home & Kitchen",
)

# fmt: off
PRODUCT_TYPES: tuple[ProductType, ...] = (
    # ---- beauty
    ProductType(
        "shampoo", "beauty", f"{_B} › Hair Care › Shampoo & Conditioner › Shampoos",
        "sulfate free shampoo", "shampoo", "",
        ("sulfate free", "paraben free", "dry hair", "hair growth", "tea tree", "cruelty free",
         "natural ingredients", "color safe"),
        (("size", ("8 fl oz", "16 fl oz", "32 fl oz")), ("scent", ("lavender", "coconut", "mint", "unscented"))),
        (6.0, 38.0)),
    ProductType(
        "lipstick", "beauty", f"{_B} › Makeup › Lips › Lipstick",
        "long lasting lipstick", "lipstick", "for Women",
        ("long lasting", "matte finish", "cruelty free", "waterproof", "moisturizing",
         "highly pigmented", "vegan formula"),
        (("color", ("red", "pink", "coral", "nude", "plum", "wine")),),
        (5.0, 29.0)),
    ProductType(
        "moisturizer", "beauty", f"{_B} › Skin Care › Face › Creams & Moisturizers",
        "face moisturizer", "face moisturizer", "",
        ("hyaluronic acid", "fine lines", "sensitive skin", "oil free", "fragrance free",
         "anti aging", "dark spots"),
        (("size", ("1.7 oz", "3.4 oz", "8 oz")),),
        (9.0, 64.0)),
    ProductType(
        "hair_extension", "beauty",
        f"{_B} › Hair Care › Hair Extensions, Wigs & Accessories › Hair Extensions",
        "clip in hair extensions", "hair extensions", "for Women",
        ("natural looking", "clip in", "heat resistant", "high quality", "easy to apply",
         "tangle free", "human hair"),
        (("color", ("black", "brown", "blonde", "auburn")), ("length", ("short", "medium", "long"))),
        (12.0, 79.0)),
    ProductType(
        "nail_polish", "beauty", f"{_B} › Foot, Hand & Nail Care › Nail Art & Polish › Nail Polish",
        "gel nail polish", "nail polish", "",
        ("quick dry", "non toxic", "long lasting", "high shine", "chip resistant", "easy apply"),
        (("color", ("red", "pink", "white", "purple", "coral", "teal")),),
        (4.0, 22.0)),
    # ---- fashion
    ProductType(
        "hiking_boots", "fashion", f"{_C} › Men › Shoes › Outdoor › Hiking & Trekking",
        "men's hiking boots", "hiking boots", "for Men",
        ("waterproof", "non slip", "rubber sole", "lightweight", "arch support", "lace up",
         "breathable mesh", "ankle support"),
        (("color", _COLOURS_DARK[:5]), ("size", ("7", "8", "9", "10", "11", "12"))),
        (35.0, 149.0)),
    ProductType(
        "running_shoes", "fashion", f"{_C} › Women › Shoes › Athletic › Running",
        "women's running shoes", "running shoes", "for Women",
        ("lightweight", "breathable mesh", "memory foam", "non slip", "rubber sole",
         "knit upper", "arch support"),
        (("color", ("black", "white", "pink", "blue", "grey", "purple")),
         ("size", ("6", "7", "8", "9", "10"))),
        (25.0, 119.0)),
    ProductType(
        "t_shirt", "fashion", f"{_C} › Men › Clothing › Shirts › T-Shirts",
        "men's cotton t-shirt", "t-shirt", "for Men",
        ("short sleeve", "cotton", "machine wash", "slim fit", "moisture wicking", "crew neck",
         "relaxed fit"),
        (("color", ("black", "white", "navy", "grey", "red", "green")), ("size", _CLOTHING_SIZES)),
        (8.0, 39.0)),
    ProductType(
        "jumpsuit", "fashion", f"{_C} › Women › Clothing › Jumpsuits, Rompers & Overalls",
        "women's jumpsuit", "jumpsuit", "for Women",
        ("high waist", "wide leg", "polyester spandex", "daily wear", "short sleeve",
         "long sleeve", "button closure"),
        (("color", ("black", "khaki", "green", "blue", "wine")), ("size", _CLOTHING_SIZES)),
        (15.0, 59.0)),
    ProductType(
        "winter_jacket", "fashion", f"{_C} › Women › Clothing › Coats, Jackets & Vests",
        "women's winter jacket", "winter jacket", "for Women",
        ("hooded", "fleece lined", "water resistant", "zip closure", "long sleeve",
         "windproof", "quilted"),
        (("color", ("black", "navy", "olive", "red", "white")), ("size", _CLOTHING_SIZES)),
        (29.0, 189.0)),
    # ---- food
    ProductType(
        "ground_coffee", "food",
        f"{_F} › Beverages › Coffee, Tea & Cocoa › Coffee › Ground Coffee",
        "ground coffee", "ground coffee", "",
        ("fair trade", "organic", "dark roast", "medium roast", "low acid", "single origin",
         "whole bean"),
        (("size", ("12 ounce", "2 pound", "1 kilogram")), ("flavor", ("original", "vanilla", "hazelnut", "mocha"))),
        (7.0, 44.0)),
    ProductType(
        "green_tea", "food", f"{_F} › Beverages › Coffee, Tea & Cocoa › Tea › Green",
        "green tea bags", "green tea", "",
        ("organic", "caffeine free", "non gmo", "individually wrapped", "loose leaf",
         "antioxidant rich"),
        (("flavor", ("jasmine", "mint", "lemon", "ginger")), ("size", ("20 count", "box of 50", "tin of 100"))),
        (4.0, 29.0)),
    ProductType(
        "protein_bars", "food", f"{_F} › Snack Foods › Bars › Protein Bars",
        "protein bars", "protein bars", "",
        ("gluten free", "low sugar", "high protein", "keto friendly", "plant based", "non gmo"),
        (("flavor", ("chocolate", "peanut butter", "cookie dough", "blueberry")),
         ("size", ("6 bars", "box of 12", "case of 24"))),
        (9.0, 49.0)),
    ProductType(
        "dark_chocolate", "food", f"{_F} › Snacks & Sweets › Chocolate › Bars",
        "dark chocolate bar", "dark chocolate", "",
        ("sugar free", "organic", "fair trade", "dairy free", "individually wrapped", "vegan"),
        (("flavor", ("sea salt", "almond", "orange", "raspberry")),),
        (3.0, 26.0)),
    ProductType(
        "olive_oil", "food", f"{_F} › Pantry Staples › Cooking Oils › Olive",
        "extra virgin olive oil", "olive oil", "",
        ("extra virgin", "cold pressed", "organic", "non gmo", "first harvest", "glass bottle"),
        (("size", ("500 ml", "1 liter", "one gallon")),),
        (8.0, 52.0)),
    # ---- electronics
    ProductType(
        "earbuds", "electronics", f"{_E} › Headphones, Earbuds & Accessories › Earbuds",
        "wireless earbuds", "wireless earbuds", "",
        ("noise cancelling", "long battery life", "waterproof", "fast charging", "touch control",
         "built in microphone", "bluetooth 5.3"),
        (("color", ("black", "white", "blue", "pink")),),
        (15.0, 129.0)),
    ProductType(
        "phone_case", "electronics", f"{_E} › Cell Phones & Accessories › Cases, Holsters & Sleeves",
        "phone case", "phone case", "",
        ("shockproof", "slim fit", "wireless charging compatible", "scratch resistant",
         "raised edges", "kickstand"),
        (("color", ("black", "clear", "blue", "purple", "green")),
         ("style", ("iphone 14", "galaxy s23", "pixel 7"))),
        (6.0, 34.0)),
    ProductType(
        "hdmi_cable", "electronics", f"{_E} › Computers & Accessories › Cables › HDMI Cables",
        "hdmi cable", "hdmi cable", "",
        ("high speed", "gold plated", "braided", "ethernet support", "4k resolution",
         "backward compatible"),
        (("size", ("3 feet", "6 feet", "25 feet")),),
        (5.0, 29.0)),
    ProductType(
        "power_bank", "electronics",
        f"{_E} › Cell Phones & Accessories › Chargers & Power Adapters › Portable Power Banks",
        "portable charger power bank", "portable charger", "",
        ("fast charging", "usb c", "led display", "compact design", "dual output",
         "high capacity"),
        (("color", ("black", "white", "blue")), ("capacity", ("5000 mah", "10000 mah", "26800 mah"))),
        (14.0, 69.0)),
    ProductType(
        "bluetooth_speaker", "electronics",
        f"{_E} › Portable Audio & Video › Portable Speakers & Docks › Bluetooth Speakers",
        "portable bluetooth speaker", "bluetooth speaker", "",
        ("waterproof", "long battery life", "deep bass", "built in microphone", "outdoor",
         "stereo pairing"),
        (("color", ("black", "red", "blue", "green", "grey")),),
        (18.0, 139.0)),
    # ---- furniture
    ProductType(
        "office_chair", "furniture", f"{_H} › Furniture › Home Office Furniture › Office Chairs",
        "ergonomic office chair", "office chair", "",
        ("lumbar support", "height adjustable", "ergonomic design", "easy assembly", "mesh back",
         "swivel", "padded armrests"),
        (("color", ("black", "grey", "white", "blue")),),
        (49.0, 329.0)),
    ProductType(
        "bed_sheets", "furniture", f"{_H} › Bedding › Sheets & Pillowcases › Sheet Sets",
        "bed sheet set", "bed sheets", "",
        ("deep pocket", "machine washable", "microfiber", "wrinkle free", "breathable",
         "hypoallergenic", "egyptian cotton"),
        (("color", ("white", "grey", "navy", "beige", "green")),
         ("size", ("twin", "full", "queen", "king"))),
        (19.0, 99.0)),
    ProductType(
        "coffee_table", "furniture",
        f"{_H} › Furniture › Living Room Furniture › Tables › Coffee Tables",
        "coffee table for living room", "coffee table", "",
        ("solid wood", "storage shelf", "easy assembly", "mid century", "living room",
         "lift top", "metal frame"),
        (("color", ("walnut", "black", "white", "grey")),),
        (59.0, 289.0)),
    ProductType(
        "bookshelf", "furniture", f"{_H} › Furniture › Home Office Furniture › Bookcases",
        "bookshelf", "bookshelf", "",
        ("easy assembly", "solid wood", "industrial style", "adjustable shelves", "wall mounted",
         "space saving"),
        (("color", ("black", "white", "walnut", "grey")), ("size", ("3 tier", "5 tier"))),
        (39.0, 219.0)),
    ProductType(
        "table_lamp", "furniture", f"{_H} › Lighting › Lamps & Shades › Table Lamps",
        "bedside table lamp", "table lamp", "",
        ("usb port", "dimmable", "touch control", "energy efficient", "linen shade",
         "bedside", "modern design"),
        (("color", ("black", "white", "gold", "silver")),),
        (16.0, 89.0)),
)
# fmt: on

BRANDS: dict[str, tuple[str, ...]] = {
    "beauty": ("Lumera", "Velora", "Naturis", "Bellacove", "Puresse", "Rosabay", "Dermaly"),
    "fashion": ("Trailpeak", "Northvale", "Urbanfield", "Kestrelle", "Corvane", "Halden", "Ruvio"),
    "food": ("Harvestly", "Beanwright", "Oakmere", "Gildane", "Meadowfare", "Kernelia", "Tavira"),
    "electronics": ("Voltic", "Sonara", "Zentro", "Ampiq", "Nexora", "Vireon", "Qubix"),
    "furniture": ("Oakhaven", "Nordby", "Casaluxe", "Woodvane", "Hearthly", "Aldercraft"),
}

# {attrs}: attribute phrases joined as "a, b and c"; {noun}: the product type's noun phrase.
INSTRUCTION_TEMPLATES: tuple[str, ...] = (
    "i need {attrs} {noun}",
    "i am looking for {attrs} {noun}",
    "find me {attrs} {noun}",
    "i want to buy {noun} that is {attrs}",
    "i'm searching for {noun}, {attrs}",
)
