"""What a household room may hold: room kinds, receptacles, objects and what they afford.

The tables are written for this package from ALFWorld's public facts (ALFWorld, Shridhar et
al., arXiv 2010.03768; AI2-THOR / ALFRED object lists): which receptacle types appear in
kitchens, living rooms, bedrooms and bathrooms; which of them open and close; which object
types may be put where (ALFWorld's ``canContain`` facts); and which objects can be heated
(microwave), cooled (fridge), cleaned (sink basin) or looked at under a desk lamp.

Departures from ALFWorld (kept small on purpose, see docs/envs/household.md):
- the lists are shorter than AI2-THOR's (no sliced objects, no floor lamps, no boxes that
  hold other objects);
- a desk lamp always sits on a side table, desk or dresser of a living room or bedroom.
"""

from __future__ import annotations

from mcgpo.envs.alfworld_keys import PROCESS_OF, TASK_TYPES

__all__ = [
    "APPLIANCE",
    "LAMP",
    "LAMP_HOLDERS",
    "OBJECTS",
    "OPENABLE",
    "PROCESSES",
    "ROOMS",
    "ROOM_OBJECTS",
    "TASK_ROOMS",
    "TASK_TYPES",
]

# Receptacles that open and close; what lies inside is hidden while closed.
OPENABLE: frozenset[str] = frozenset({"cabinet", "drawer", "fridge", "microwave", "safe"})

# process -> the receptacle type that performs it ("heat X with microwave 1", ...).
APPLIANCE: dict[str, str] = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}

# task type -> the process its target needs (None: no processing).
PROCESSES: dict[str, str | None] = {t: PROCESS_OF.get(t) for t in TASK_TYPES}

LAMP = "desklamp"  # toggled with "use desklamp N"; never picked up
LAMP_HOLDERS: tuple[str, ...] = ("desk", "dresser", "sidetable")

# Room kind -> {receptacle type: (min count, max count)}. A type with min >= 1 is in every
# room of that kind. Counts follow the spread of AI2-THOR floor plans, trimmed a little.
ROOMS: dict[str, dict[str, tuple[int, int]]] = {
    "kitchen": {
        "cabinet": (1, 10),
        "coffeemachine": (0, 1),
        "countertop": (1, 3),
        "diningtable": (0, 1),
        "drawer": (1, 8),
        "fridge": (1, 1),
        "garbagecan": (1, 1),
        "microwave": (1, 1),
        "shelf": (0, 3),
        "sidetable": (0, 1),
        "sinkbasin": (1, 1),
        "stoveburner": (1, 4),
        "toaster": (0, 1),
    },
    "livingroom": {
        "armchair": (0, 2),
        "cabinet": (0, 4),
        "coffeetable": (1, 2),
        "diningtable": (0, 1),
        "drawer": (0, 6),
        "dresser": (0, 1),
        "garbagecan": (1, 1),
        "ottoman": (0, 1),
        "safe": (0, 1),
        "shelf": (0, 6),
        "sidetable": (1, 3),
        "sofa": (1, 1),
        "tvstand": (0, 1),
    },
    "bedroom": {
        "armchair": (0, 1),
        "bed": (1, 1),
        "desk": (0, 2),
        "drawer": (1, 10),
        "dresser": (0, 1),
        "garbagecan": (1, 1),
        "laundryhamper": (0, 1),
        "safe": (0, 1),
        "shelf": (0, 6),
        "sidetable": (1, 2),
    },
    "bathroom": {
        "bathtubbasin": (0, 1),
        "cabinet": (1, 4),
        "cart": (0, 1),
        "countertop": (1, 1),
        "drawer": (0, 4),
        "garbagecan": (1, 1),
        "handtowelholder": (0, 2),
        "shelf": (0, 2),
        "sinkbasin": (1, 2),
        "toilet": (1, 1),
        "toiletpaperhanger": (1, 1),
        "towelholder": (1, 2),
    },
}

# Task type -> room kinds where it is posed (heating and cooling need a kitchen, cleaning a
# sink basin, looking under a lamp a room with a desk lamp), as in ALFWorld.
TASK_ROOMS: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("kitchen", "livingroom", "bedroom", "bathroom"),
    "look_at_obj_in_light": ("livingroom", "bedroom"),
    "pick_clean_then_place_in_recep": ("kitchen", "bathroom"),
    "pick_heat_then_place_in_recep": ("kitchen",),
    "pick_cool_then_place_in_recep": ("kitchen",),
    "pick_two_obj_and_place": ("kitchen", "livingroom", "bedroom", "bathroom"),
}

# Shorthands for the places an object may be put (the receptacle side of canContain).
_TABLES = ("countertop", "diningtable")
_FOOD = (*_TABLES, "fridge", "microwave", "sinkbasin", "garbagecan")
_DISHES = (*_TABLES, "cabinet", "shelf", "sinkbasin", "microwave", "fridge")
_COOKWARE = (*_TABLES, "stoveburner", "cabinet", "sinkbasin", "fridge")
_CUTLERY = (*_TABLES, "drawer", "sinkbasin")
_SMALL_THINGS = ("desk", "sidetable", "dresser", "drawer", "shelf", "coffeetable", "safe")
_SEATS = ("sofa", "armchair", "bed")
_BATH = ("countertop", "cabinet", "shelf", "toilet", "cart", "drawer")

# Object type -> (receptacle types it may be put on or in, processes it affords).
OBJECTS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    # kitchen: food
    "apple": (_FOOD, frozenset({"heat", "cool", "clean"})),
    "bread": ((*_TABLES, "fridge", "microwave", "garbagecan"), frozenset({"heat", "cool"})),
    "egg": (_FOOD, frozenset({"heat", "cool", "clean"})),
    "lettuce": ((*_TABLES, "fridge", "sinkbasin", "garbagecan"), frozenset({"cool", "clean"})),
    "potato": (_FOOD, frozenset({"heat", "cool", "clean"})),
    "tomato": (_FOOD, frozenset({"heat", "cool", "clean"})),
    # kitchen: dishes and tools
    "bowl": (_DISHES, frozenset({"cool", "clean"})),
    "cup": (_DISHES, frozenset({"heat", "cool", "clean"})),
    "mug": ((*_DISHES, "coffeemachine", "desk"), frozenset({"heat", "cool", "clean"})),
    "plate": (_DISHES, frozenset({"heat", "cool", "clean"})),
    "pan": (_COOKWARE, frozenset({"cool", "clean"})),
    "pot": (_COOKWARE, frozenset({"cool", "clean"})),
    "kettle": ((*_TABLES, "stoveburner", "cabinet", "sinkbasin"), frozenset({"clean"})),
    "butterknife": (_CUTLERY, frozenset({"clean"})),
    "fork": (_CUTLERY, frozenset({"clean"})),
    "knife": (_CUTLERY, frozenset({"clean"})),
    "ladle": (_CUTLERY, frozenset({"clean"})),
    "spatula": (_CUTLERY, frozenset({"clean"})),
    "spoon": (_CUTLERY, frozenset({"clean"})),
    "dishsponge": ((*_CUTLERY, "cabinet", "cart"), frozenset({"clean"})),
    "peppershaker": ((*_TABLES, "cabinet", "drawer", "shelf"), frozenset()),
    "saltshaker": ((*_TABLES, "cabinet", "drawer", "shelf"), frozenset()),
    "winebottle": ((*_TABLES, "fridge", "cabinet", "shelf"), frozenset({"cool"})),
    "glassbottle": ((*_TABLES, "fridge", "cabinet", "shelf", "garbagecan"), frozenset()),
    # living room and bedroom
    "alarmclock": (("desk", "sidetable", "dresser", "shelf"), frozenset()),
    "book": ((*_SEATS, *_SMALL_THINGS, "diningtable"), frozenset()),
    "cd": ((*_SMALL_THINGS, "garbagecan"), frozenset()),
    "cellphone": ((*_SEATS, *_SMALL_THINGS, "diningtable"), frozenset()),
    "creditcard": ((*_SEATS, *_SMALL_THINGS, "diningtable", "cabinet"), frozenset()),
    "keychain": ((*_SEATS, *_SMALL_THINGS, "cabinet"), frozenset()),
    "laptop": (("bed", "sofa", "desk", "coffeetable", "diningtable", "sidetable"), frozenset()),
    "newspaper": ((*_SEATS, "coffeetable", "sidetable", "tvstand", "garbagecan"), frozenset()),
    "pen": (("desk", "sidetable", "drawer", "dresser", "shelf", "diningtable"), frozenset()),
    "pencil": (("desk", "sidetable", "drawer", "dresser", "shelf", "diningtable"), frozenset()),
    "pillow": (_SEATS, frozenset()),
    "remotecontrol": (
        ("sofa", "armchair", "coffeetable", "sidetable", "tvstand", "dresser", "drawer", "ottoman"),
        frozenset(),
    ),
    "statue": (
        ("shelf", "sidetable", "coffeetable", "dresser", "tvstand", "cabinet", "safe"),
        frozenset(),
    ),
    "vase": (
        ("shelf", "sidetable", "coffeetable", "dresser", "tvstand", "cabinet", "safe"),
        frozenset(),
    ),
    "watch": (_SMALL_THINGS, frozenset()),
    # bathroom
    "candle": (_BATH, frozenset()),
    "cloth": (
        (*_BATH, "sinkbasin", "bathtubbasin", "laundryhamper", "dresser"),
        frozenset({"clean"}),
    ),
    "soapbar": ((*_BATH, "sinkbasin", "bathtubbasin", "garbagecan"), frozenset({"clean"})),
    "soapbottle": ((*_BATH, "garbagecan"), frozenset()),
    "spraybottle": ((*_BATH, "garbagecan"), frozenset()),
    "tissuebox": ((*_BATH, "sidetable", "dresser", "coffeetable"), frozenset()),
    "toiletpaper": ((*_BATH, "toiletpaperhanger", "garbagecan"), frozenset()),
    "towel": (("towelholder", "cart", "bathtubbasin"), frozenset()),
    "handtowel": (("handtowelholder", "cart", "countertop"), frozenset()),
}

# Room kind -> object types found there.
# fmt: off
ROOM_OBJECTS: dict[str, tuple[str, ...]] = {
    "kitchen": (
        "apple", "bread", "egg", "lettuce", "potato", "tomato", "bowl", "cup", "mug",
        "plate", "pan", "pot", "kettle", "butterknife", "fork", "knife", "ladle", "spatula",
        "spoon", "dishsponge", "peppershaker", "saltshaker", "winebottle", "glassbottle",
    ),
    "livingroom": (
        "book", "cellphone", "creditcard", "keychain", "laptop", "newspaper", "pillow",
        "remotecontrol", "statue", "vase", "watch", "tissuebox", "cd",
    ),
    "bedroom": (
        "alarmclock", "book", "cd", "cellphone", "creditcard", "keychain", "laptop", "mug",
        "pen", "pencil", "pillow", "watch", "cloth", "tissuebox",
    ),
    "bathroom": (
        "candle", "cloth", "soapbar", "soapbottle", "spraybottle", "tissuebox",
        "toiletpaper", "towel", "handtowel", "dishsponge",
    ),
}
# fmt: on
