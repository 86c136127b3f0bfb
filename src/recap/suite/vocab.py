"""The small closed vocabulary of words drawn in images, with short glosses.

Every word is upper case, 3-5 letters, and fits on a board in >= 40 pt glyphs.
Glosses give answers a content-dependent continuation after the word is read.
"""

from __future__ import annotations

# word -> (what it is, what you can do there)
SHOP_WORDS: dict[str, tuple[str, str]] = {
    "CAFE": ("a small cafe", "people can sit down for coffee or a snack"),
    "BANK": ("a bank", "people can save or take out money"),
    "BOOKS": ("a bookshop", "readers can buy new stories and school books"),
    "PIZZA": ("a pizza place", "hungry people can order a hot pizza"),
    "HOTEL": ("a hotel", "travellers can stay for the night"),
    "FISH": ("a fish shop", "cooks can buy fresh fish for dinner"),
    "BREAD": ("a bakery", "people can buy fresh bread in the morning"),
    "CAKE": ("a cake shop", "customers can order a cake for a party"),
    "FRUIT": ("a fruit stand", "shoppers can pick apples, pears and other fruit"),
    "TOYS": ("a toy shop", "children can look for games and toys"),
    "SHOP": ("a general store", "people can buy everyday things"),
    "GYM": ("a gym", "people can go to exercise and stay fit"),
    "POST": ("a post office", "people can send letters and parcels"),
}
ROAD_WORDS: dict[str, tuple[str, str]] = {
    "STOP": ("a stop sign", "drivers must come to a full stop"),
    "EXIT": ("an exit sign", "it shows the way out"),
    "SLOW": ("a warning sign", "drivers should slow down here"),
    "PARK": ("a parking sign", "cars are allowed to park nearby"),
    "TAXI": ("a taxi sign", "people can wait here to catch a taxi"),
    "ZOO": ("a sign for the zoo", "visitors are close to the animals"),
}
BOTTLE_WORDS: dict[str, tuple[str, str]] = {
    "MILK": ("a bottle of milk", "it holds milk to drink or to pour on cereal"),
    "TEA": ("a bottle of tea", "it holds a cold tea drink"),
    "SODA": ("a bottle of soda", "it holds a sweet fizzy drink"),
    "JAM": ("a jar of jam", "it holds fruit jam for toast"),
    "OIL": ("a bottle of oil", "it holds cooking oil for the kitchen"),
    "JUICE": ("a bottle of juice", "it holds fruit juice"),
}
ADJECTIVES: tuple[str, ...] = ("NEW", "HOT", "COLD", "FREE", "BIG", "OPEN")
NUMBER_NOUNS: tuple[str, ...] = ("BUS", "GATE", "ROOM", "EXIT", "SALE")

NOUNS: tuple[str, ...] = tuple(sorted({*SHOP_WORDS, *ROAD_WORDS, *BOTTLE_WORDS}))
ALL_WORDS: tuple[str, ...] = tuple(sorted({*NOUNS, *ADJECTIVES, *NUMBER_NOUNS}))
