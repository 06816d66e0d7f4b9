"""Environment stage (tool_calling): the search tool over a small generated encyclopedia.

The corpus describes a fictional world (people, the cities they were born in, the countries
those cities lie in, and the countries' populations), so no model can know an answer without
looking it up, and a question about a person's country needs one lookup per hop. Documents are
ranked by BM25 (rank_bm25). The world is generated from a fixed seed: the same corpus on every
machine, for every episode and split.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field
from rank_bm25 import BM25Okapi

WORLD_SEED = 2026
NUM_COUNTRIES = 8
NUM_CITIES = 24
NUM_PEOPLE = 96
NUM_RESULTS = 5  # documents returned per search
_SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ren",
    "sa",
    "tor",
    "vel",
    "zu",
    "bri",
    "dan",
    "el",
    "fa",
    "gor",
    "hu",
    "is",
    "jan",
)
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class World:
    """The facts the corpus states; questions are generated from the same facts."""

    birth_city: dict[str, str]  # person -> city
    country_of: dict[str, str]  # city -> country
    population_millions: dict[str, int]  # country -> population
    documents: tuple[str, ...]


@functools.cache
def world() -> World:
    """The one fictional world (built once per process from WORLD_SEED)."""
    rng = random.Random(WORLD_SEED)
    names = _unique_names(rng, NUM_COUNTRIES + NUM_CITIES + NUM_PEOPLE)
    countries = names[:NUM_COUNTRIES]
    cities = names[NUM_COUNTRIES : NUM_COUNTRIES + NUM_CITIES]
    people = names[NUM_COUNTRIES + NUM_CITIES :]
    country_of = {city: rng.choice(countries) for city in cities}
    population = {country: rng.randint(2, 99) for country in countries}
    birth_city = {person: rng.choice(cities) for person in people}
    documents = (
        *(f"{person} was born in {city}." for person, city in birth_city.items()),
        *(f"{city} is a city in the country of {country}." for city, country in country_of.items()),
        *(f"{country} has a population of {population[country]} million." for country in countries),
    )
    return World(birth_city, country_of, population, documents)


def _unique_names(rng: random.Random, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
        if name not in names:
            names.append(name)
    return names


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@functools.cache
def _index() -> BM25Okapi:
    return BM25Okapi([_tokens(document) for document in world().documents])


def search(query: Annotated[str, Field(description="keywords, e.g. a name and 'country'")]) -> str:
    """Search the encyclopedia; returns the best matching sentences, one per line."""
    scores = _index().get_scores(_tokens(query))
    ranked = sorted(range(len(scores)), key=lambda index: (-scores[index], index))[:NUM_RESULTS]
    hits = [world().documents[index] for index in ranked if scores[index] > 0]
    return "\n".join(hits) if hits else "No results."
